"""Operators may look at notification lists and their recipients (read-only): the console's list
tools (who would receive, the recipients) are part of triage. Additive and idempotent, as 0004."""

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


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0007_delivery_resilience"),
    ]

    operations = [
        migrations.RunPython(grant_list_view, migrations.RunPython.noop),
    ]
