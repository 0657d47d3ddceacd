"""Duplicates: the index the anchor is looked up by holds only the rows that can be anchors.

A new keyed notification's anchor is its key's last row that was not suppressed. The index of
0031 held every keyed row, so the lookup stepped over each duplicate suppressed since the
anchor: with a chattering alarm (thousands of repeats within the window) each ingest read more
rows than the one before. The new index leaves out the rows with a ``suppressed_by`` (set at
ingest on a duplicate, silenced or digested row, and kept when one is delivered anyway), so
the lookup reads the anchor alone.

The new index is built before the old one is dropped, both CONCURRENTLY: ingest goes on, and
the lookup has an index throughout (the release before this one looks up with the same
conditions, so it uses the new index too). Not atomic on PostgreSQL: if it is interrupted while
the index is built, drop the invalid index (``DROP INDEX CONCURRENTLY notif_dedup_anchor_idx``)
and migrate again.
"""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible, RemoveIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("notifications", "0038_duplicate_decided"),
    ]

    operations = [
        AddIndexConcurrentlyWherePossible(
            model_name="notification",
            index=models.Index(
                condition=models.Q(models.Q(("dedup_key", ""), _negated=True), ("suppressed_by", "")),
                fields=["source_site_id", "list_name", "dedup_key", "-created_at"],
                name="notif_dedup_anchor_idx",
            ),
        ),
        RemoveIndexConcurrentlyWherePossible(model_name="notification", name="notif_dedup_idx"),
    ]
