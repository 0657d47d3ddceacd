"""Database defaults for three columns added before the rule that every later column of the
notifications table is nullable or has one (ALTER COLUMN … SET DEFAULT: catalogue only)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0025_acknowledgement_escalation'),
    ]

    operations = [
        migrations.AlterField(
            model_name='notification',
            name='channel_failures',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name='notification',
            name='discard_reason',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AlterField(
            model_name='notification',
            name='discarded_by',
            field=models.CharField(blank=True, db_default='', default='', max_length=150),
        ),
    ]
