"""Staff API keys (hashed, named, expiring) replace Django REST framework's plaintext tokens.

Every token of ``rest_framework.authtoken`` (if that table exists) becomes a staff key of the
same user holding the token's hash, named "migrated token", expiring MIGRATED_DAYS days after
the upgrade: scripts keep sending ``Authorization: Token <token>`` unchanged until then. The
plaintext table is dropped (and its migration records, so that the app could be installed
anew). Reversing drops the staff keys; the old tokens cannot come back.
"""

from datetime import timedelta

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone
from rest_framework_api_key.crypto import KeyGenerator

MIGRATED_DAYS = 90
MIGRATED_NAME = "migrated token"


def migrate_plaintext_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    StaffAPIKey = apps.get_model("sites", "StaffAPIKey")
    generator = KeyGenerator()
    expiry = timezone.now() + timedelta(days=MIGRATED_DAYS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        tokens = cursor.fetchall()
    for token, user_id in tokens:
        # A token has no prefix of its own: its first characters serve (sites.services.staff_key_verify).
        prefix = token[:8]
        if StaffAPIKey.objects.using(connection.alias).filter(prefix=prefix).exists():
            continue  # two tokens sharing their first 8 characters: the second is not carried over
        hashed = generator.hash(token)
        StaffAPIKey.objects.using(connection.alias).create(
            id=f"{prefix}.{hashed}",
            prefix=prefix,
            hashed_key=hashed,
            name=MIGRATED_NAME,
            user_id=user_id,
            expiry_date=expiry,
        )
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE authtoken_token")
        cursor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")


class Migration(migrations.Migration):

    dependencies = [
        ('sites', '0004_api_key_last_used'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='StaffAPIKey',
            fields=[
                ('id', models.CharField(editable=False, max_length=150, primary_key=True, serialize=False, unique=True)),
                ('prefix', models.CharField(editable=False, max_length=8, unique=True)),
                ('hashed_key', models.CharField(editable=False, max_length=150)),
                ('created', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('name', models.CharField(default=None, help_text='A free-form name for the API key. Need not be unique. 50 characters max.', max_length=50)),
                ('revoked', models.BooleanField(blank=True, default=False, help_text='If the API key is revoked, clients cannot use it anymore. (This cannot be undone.)')),
                ('expiry_date', models.DateTimeField(help_text='Once the key expires, requests with it are refused.', verbose_name='expires')),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='staff_api_keys', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'staff API key',
                'verbose_name_plural': 'staff API keys',
                'ordering': ('-created',),
                'abstract': False,
            },
        ),
        migrations.RunPython(migrate_plaintext_tokens, migrations.RunPython.noop),
    ]
