"""Stored credentials bound to the destination they were entered for
(notifications.secret_binding), and Teams URLs encrypted at rest.

Every credential already stored is bound to where its row points now: the installation's
current destinations are the ones its administrators entered the credentials for. A secret
that no configured key decrypts stays unbound (delivery refuses it either way until it is
entered again). Teams Workflows URLs are encrypted in place; a list holds a URL at most once
by its digest, since the encrypted forms always differ.
"""

import hashlib

import notifications.fields
from django.db import migrations, models
from django.db.models import TextField
from django.db.models.functions import Cast

from notifications.secret_binding import BINDINGS, secret_digest
from notifications.secrets import SecretDecryptionError, secret_decrypt

MODELS = {"smtpconfiguration": "SmtpConfiguration", "channelconfiguration": "ChannelConfiguration",
          "webhooktarget": "WebhookTarget"}


def _plain(stored):
    try:
        return secret_decrypt(stored)
    except SecretDecryptionError:
        return None


def bind_existing_secrets(apps, schema_editor):
    for model_name, bindings in BINDINGS.items():
        model = apps.get_model("notifications", MODELS[model_name])
        for binding in bindings:
            rows = model.objects.exclude(**{binding.secret: ""}).values(
                "pk", *binding.fields, stored=Cast(binding.secret, TextField())
            )
            for row in rows:
                secret = _plain(row["stored"])
                if secret:
                    digest = secret_digest(binding=binding, secret=secret, values=row)
                    model.objects.filter(pk=row["pk"]).update(**{binding.binding_field: digest})


def encrypt_teams_urls(apps, schema_editor):
    TeamsTarget = apps.get_model("notifications", "TeamsTarget")
    for row in TeamsTarget.objects.values("pk", stored=Cast("url", TextField())):
        url = _plain(row["stored"])
        if url is not None:
            # The field encrypts on update; the digest is notifications.secret_binding.teams_url_digest's.
            digest = hashlib.sha256(url.encode()).hexdigest()
            TeamsTarget.objects.filter(pk=row["pk"]).update(url=url, url_digest=digest)


def decrypt_teams_urls(apps, schema_editor):
    TeamsTarget = apps.get_model("notifications", "TeamsTarget")
    table = TeamsTarget._meta.db_table
    rows = list(TeamsTarget.objects.values_list("pk", Cast("url", TextField())))
    with schema_editor.connection.cursor() as cursor:
        for pk, stored in rows:
            url = _plain(stored)
            if url is None:
                raise RuntimeError(f"Teams target {pk}: its URL does not decrypt with the configured keys.")
            cursor.execute(f"UPDATE {table} SET url = %s WHERE id = %s", [url, pk])


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0018_drop_subject_trigram_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='channelconfiguration',
            name='auth_token_binding',
            field=models.CharField(blank=True, editable=False, help_text='Digest of the destination the auth token was entered for (notifications.secret_binding).', max_length=64),
        ),
        migrations.AddField(
            model_name='smtpconfiguration',
            name='oauth_client_certificate_binding',
            field=models.CharField(blank=True, editable=False, help_text='Digest of the destination the OAuth client certificate path was entered for (notifications.secret_binding).', max_length=64),
        ),
        migrations.AddField(
            model_name='smtpconfiguration',
            name='oauth_client_secret_binding',
            field=models.CharField(blank=True, editable=False, help_text='Digest of the destination the OAuth client secret was entered for (notifications.secret_binding).', max_length=64),
        ),
        migrations.AddField(
            model_name='smtpconfiguration',
            name='password_binding',
            field=models.CharField(blank=True, editable=False, help_text='Digest of the destination the password was entered for (notifications.secret_binding).', max_length=64),
        ),
        migrations.AddField(
            model_name='webhooktarget',
            name='secret_binding',
            field=models.CharField(blank=True, editable=False, help_text='Digest of the destination the signing secret was entered for (notifications.secret_binding).', max_length=64),
        ),
        migrations.RunPython(bind_existing_secrets, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name='teamstarget',
            name='teams_target_unique_per_list',
        ),
        migrations.AlterField(
            model_name='teamstarget',
            name='url',
            field=notifications.fields.EncryptedTextField(help_text='Stored encrypted; shown masked.', verbose_name='Workflows URL'),
        ),
        migrations.AddField(
            model_name='teamstarget',
            name='url_digest',
            field=models.CharField(default='', editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(encrypt_teams_urls, decrypt_teams_urls),
        migrations.AddConstraint(
            model_name='teamstarget',
            constraint=models.UniqueConstraint(fields=('notification_list', 'url_digest'), name='teams_target_unique_per_list'),
        ),
    ]
