"""The two console roles (docs/operations.md): Operators watch the outbox and retry or discard parked
notifications; Administrators also manage notification lists, the SMTP configuration and
sites with their keys. Nobody gets add/change/delete on notifications: the admin refuses them
to everyone anyway, and the groups should say what the roles are.

Idempotent and additive: re-running adds missing permissions, never removes ones granted later.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

OPERATOR_PERMISSIONS = [
    ("notifications", "view_notification"),
    ("notifications", "retry_notification"),
    ("notifications", "discard_notification"),
    ("notifications", "view_deliveryattempt"),
]

ADMINISTRATOR_PERMISSIONS = OPERATOR_PERMISSIONS + [
    (app, f"{action}_{model}")
    for app, model in [
        ("notifications", "notificationlist"),
        ("notifications", "emailrecipient"),
        ("notifications", "smtpconfiguration"),
        ("sites", "site"),
        ("sites", "siteapikey"),
    ]
    for action in ("view", "add", "change", "delete")
]

GROUPS = {"Operators": OPERATOR_PERMISSIONS, "Administrators": ADMINISTRATOR_PERMISSIONS}


def create_roles(apps, schema_editor):
    # Permissions are normally created after all migrations (post_migrate); on a fresh
    # database they do not exist yet, so create them now for the apps involved.
    for label in ("notifications", "sites"):
        app_config = apps.get_app_config(label)
        # Migration state has no models module, and create_permissions skips such apps.
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
            permission = Permission.objects.using(db).get(content_type__app_label=app_label, codename=codename)
            group.permissions.add(permission)


def delete_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.using(schema_editor.connection.alias).filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0003_smtp_password_encrypted"),
        ("sites", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(create_roles, delete_roles)]
