"""A notification's priority (critical, high, normal, low), stored as a small integer with a
constant default: PostgreSQL adds the column without rewriting the table.

Written on the watchdogs branch only so that central accepts what the round-3 agent sends
(``priority`` for critical rows); the priority branch owns this column. At merge keep that
branch's migration and drop this one."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0020_smtp_greeting_timeout'),
    ]

    operations = [
        migrations.AddField(
            model_name='notification',
            name='priority',
            field=models.PositiveSmallIntegerField(choices=[(0, 'low'), (1, 'normal'), (2, 'high'), (3, 'critical')], db_default=1, default=1),
        ),
    ]
