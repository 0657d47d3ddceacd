"""Operators may set, change and end silences and see maintenance windows; Administrators may
also edit maintenance windows (idempotently, like 0021)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

SILENCES = [("notifications", f"{action}_silence") for action in ("view", "add", "change", "delete")]
WINDOWS = [("notifications", f"{action}_maintenancewindow") for action in ("view", "add", "change", "delete")]
GROUPS = {
    "Operators": [*SILENCES, ("notifications", "view_maintenancewindow")],
    "Administrators": [*SILENCES, *WINDOWS],
}


def grant_roles(apps, schema_editor):
    app_config = apps.get_app_config("notifications")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # see 0004: migration state has no models module
    try:
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    finally:
        app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    for name, wanted in GROUPS.items():
        group = Group.objects.using(db).filter(name=name).first()
        if group is None:
            continue  # the roles were removed on purpose; do not bring them back
        for app_label, codename in wanted:
            permission = Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename)
            group.permissions.add(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0031_suppression_validate"),
    ]

    operations = [migrations.RunPython(grant_roles, migrations.RunPython.noop)]
