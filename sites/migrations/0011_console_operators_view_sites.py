"""Operators see the sites' pages, read-only (state, silent or direct, last post, watchdogs,
rows parked at the site): what they need at night to tell where a problem is. Keys stay with
the Administrators. Idempotent and additive, like the console roles it extends."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_PERMISSIONS = [("sites", "view_site")]


def grant(apps, schema_editor):
    app_config = apps.get_app_config("sites")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True
    try:
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    finally:
        app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    group = Group.objects.using(db).filter(name="Operators").first()
    if group is None:
        return  # the role was removed on purpose; do not bring it back
    for app_label, codename in OPERATOR_PERMISSIONS:
        group.permissions.add(Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    permissions = Permission.objects.using(db).filter(content_type__app_label="sites", codename="view_site")
    for group in Group.objects.using(db).filter(name="Operators"):
        group.permissions.remove(*permissions)


class Migration(migrations.Migration):
    dependencies = [("sites", "0010_acknowledged_commands")]
    operations = [migrations.RunPython(grant, revoke)]
