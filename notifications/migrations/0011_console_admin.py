"""The console's administration tools and trends.

Operators may look at notification lists and their recipients (read-only): the console's list
tools (who would receive, the recipients) are part of triage. Additive and idempotent, as 0004.

The dashboard's hourly trends count delivered rows by (delivered_at, source_site_id, type) from a
partial index of delivered rows alone. It replaces the KPI index on (delivered_at,
source_site_id), whose columns it starts with, so delivery still maintains one such index.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_VIEW = [("notifications", "view_notificationlist"), ("notifications", "view_emailrecipient")]


def grant_list_view(apps, schema_editor):
    app_config = apps.get_app_config("notifications")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # see 0004: migration state has no models module
    try:
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    finally:
        app_config.models_module = original
    db = schema_editor.connection.alias
    group = apps.get_model("auth", "Group").objects.using(db).filter(name="Operators").first()
    if group is None:
        return  # the role was removed on purpose; do not bring it back
    Permission = apps.get_model("auth", "Permission")
    for app_label, codename in OPERATOR_VIEW:
        group.permissions.add(Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename))


TREND_INDEX = "(delivered_at, source_site_id, type) WHERE status = 'Delivered'"
KPI_INDEX = "(delivered_at, source_site_id) WHERE status = 'Delivered'"


def trend_index_forward(apps, schema_editor):
    schema_editor.execute(f"CREATE INDEX IF NOT EXISTS notif_trend_delivered_idx ON notifications_notification {TREND_INDEX}")
    schema_editor.execute("DROP INDEX IF EXISTS notif_kpi_delivered_idx")


def trend_index_backward(apps, schema_editor):
    schema_editor.execute(f"CREATE INDEX IF NOT EXISTS notif_kpi_delivered_idx ON notifications_notification {KPI_INDEX}")
    schema_editor.execute("DROP INDEX IF EXISTS notif_trend_delivered_idx")


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0010_smtp_relay_connect"),
    ]

    operations = [
        migrations.RunPython(grant_list_view, migrations.RunPython.noop),
        migrations.RunPython(trend_index_forward, trend_index_backward),
    ]
