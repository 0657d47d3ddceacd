"""Priority and the fair claim (docs/architecture.md, "How a notification is delivered").

- ``priority``: a small integer with a database default (normal), so adding it to a table of
  millions of rows changes only the catalogue (PostgreSQL: no rewrite, no scan); its check
  constraint is added NOT VALID and validated afterwards, which lets writers go on.
- ``notif_claim_idx``: the open rows by (site, priority, channel, due time), which the fair
  claim reads key by key; it replaces ``notif_due_idx`` (open rows by due time alone).
- ``notif_priority_created_idx``: the console's sort by priority.

On PostgreSQL the indexes are created and dropped CONCURRENTLY, so the migration is not atomic:
if it is interrupted while an index is built, PostgreSQL keeps an invalid index of that name;
drop it (``DROP INDEX CONCURRENTLY notif_claim_idx``) and migrate again (docs/operations.md).
"""

import notifications.db
from django.db import migrations, models

from notifications.migration_operations import (
    AddCheckConstraintValidatedLater,
    AddIndexConcurrentlyWherePossible,
    RemoveIndexConcurrentlyWherePossible,
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('notifications', '0022_channel_health_shape'),
    ]

    operations = [
        migrations.AddField(
            model_name='notification',
            name='priority',
            field=models.SmallIntegerField(choices=[(0, 'low'), (1, 'normal'), (2, 'high'), (3, 'critical')], db_default=1, default=1),
        ),
        AddCheckConstraintValidatedLater(
            model_name='notification',
            constraint=models.CheckConstraint(condition=models.Q(('priority__in', [0, 1, 2, 3])), name='notif_priority_valid'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=notifications.db.ClaimIndex(condition=models.Q(('status__in', ['Pending', 'Retrying'])), name='notif_claim_idx'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(fields=['priority', 'created_at'], name='notif_priority_created_idx'),
        ),
        RemoveIndexConcurrentlyWherePossible(
            model_name='notification',
            name='notif_due_idx',
        ),
    ]
