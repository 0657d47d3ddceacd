"""Rate limits that count notifications, shared by every web process (sites/rate_limits.py): a
site's own limit and burst (empty: the installation's), and the table of rate buckets."""

import django.core.validators
import django.db.models.deletion
import sites.models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sites', '0006_key_refusals_heartbeat_details'),
    ]

    operations = [
        migrations.AddField(
            model_name='site',
            name='rate_burst',
            field=models.PositiveIntegerField(blank=True, help_text='How many notifications this site may send at once before the rate applies; at least the largest batch (OUTBOX_BATCH_MAX_ITEMS). Empty: the default, OUTBOX_SITE_RATE_BURST.', null=True, validators=[sites.models.rate_burst_validate], verbose_name='rate burst (notifications)'),
        ),
        migrations.AddField(
            model_name='site',
            name='rate_limit',
            field=models.FloatField(blank=True, help_text='Notifications per second this site may send, sustained, counted over every web process (a batch of N counts N). Empty: the default, OUTBOX_SITE_RATE_LIMIT. 0: no limit for this site. Critical notifications have a budget of their own.', null=True, validators=[django.core.validators.MinValueValidator(0)], verbose_name='rate limit (notifications per second)'),
        ),
        migrations.CreateModel(
            name='SiteRateBucket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope', models.CharField(max_length=16)),
                ('tokens', models.FloatField()),
                ('refilled_at', models.DateTimeField()),
                ('granted', models.FloatField(default=0)),
                ('site', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rate_buckets', to='sites.site')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('site', 'scope'), name='sites_rate_bucket_unique')],
            },
        ),
    ]
