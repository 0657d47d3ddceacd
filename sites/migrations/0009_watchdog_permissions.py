"""Operators and Administrators see the sites' watchdogs (state, last ping, the notifications they
raised); Administrators may also retire one. Idempotent and additive, like the console roles it
extends."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_PERMISSIONS = [("sites", "view_watchdog"), ("sites", "view_watchdogalert")]
ADMINISTRATOR_PERMISSIONS = [*OPERATOR_PERMISSIONS, ("sites", "retire_watchdog")]
GROUPS = {"Operators": OPERATOR_PERMISSIONS, "Administrators": ADMINISTRATOR_PERMISSIONS}


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
    for name, wanted in GROUPS.items():
        group, _ = Group.objects.using(db).get_or_create(name=name)
        for app_label, codename in wanted:
            group.permissions.add(
                Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename)
            )


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    codenames = [codename for _, codename in ADMINISTRATOR_PERMISSIONS]
    permissions = Permission.objects.using(db).filter(content_type__app_label="sites", codename__in=codenames)
    for group in Group.objects.using(db).filter(name__in=GROUPS):
        group.permissions.remove(*permissions)


class Migration(migrations.Migration):
    dependencies = [("sites", "0008_watchdogs")]
    operations = [migrations.RunPython(grant, revoke)]
