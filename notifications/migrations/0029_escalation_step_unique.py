"""One child notification per parent and escalation step (notifications.escalation): a partial
unique index, built CONCURRENTLY on PostgreSQL."""

from django.db import migrations, models

from notifications.migration_operations import AddUniqueConstraintConcurrentlyWherePossible


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('notifications', '0028_site_acknowledged_index'),
    ]

    operations = [
        AddUniqueConstraintConcurrentlyWherePossible(
            model_name='notification',
            constraint=models.UniqueConstraint(
                condition=models.Q(('escalation_of__isnull', False)),
                fields=('escalation_of', 'escalation_step'),
                name='notif_escalation_step_unique',
            ),
        ),
    ]
