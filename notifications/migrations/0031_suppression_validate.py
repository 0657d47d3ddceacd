"""Suppression, the slow part: the status constraint replaced in 0027 is validated (a scan that
lets reads and writes go on), and the indexes for duplicates and held rows are built
concurrently. Not atomic on PostgreSQL: if it is interrupted while an index is built, drop the
invalid index (``DROP INDEX CONCURRENTLY notif_dedup_idx``) and migrate again.
"""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible, ValidateConstraint


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("notifications", "0030_suppression"),
    ]

    operations = [
        ValidateConstraint(model_name="notification", name="notif_status_valid"),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(condition=models.Q(('dedup_key', ''), _negated=True), fields=['source_site_id', 'list_name', 'dedup_key', '-created_at'], name='notif_dedup_idx'),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name='notification',
            index=models.Index(condition=models.Q(('held_for_digest__isnull', False)), fields=['held_for_digest'], name='notif_held_idx'),
        ),
    ]
