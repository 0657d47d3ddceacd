"""What one silence, digest or anchor held back, found by its reason (``suppressed_by``), not by
reading the table: the Silences page counts each silence's rows and links to them, "Deliver
anyway what the selected silences suppressed" and the staff API's silences list read them, and
the console's suppression filter takes an exact reason (``silence:4``, ``digest:<id>``). The
index holds only the rows that were suppressed, with their status: the rows a silence holds
back now (still ``Suppressed``) are counted from the index alone.

Built CONCURRENTLY (ingest goes on while it reads the table once). Not atomic on PostgreSQL: if
it is interrupted, drop the invalid index (``DROP INDEX CONCURRENTLY notif_suppressed_by_idx``)
and migrate again.
"""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("notifications", "0039_dedup_anchor_index"),
    ]

    operations = [
        AddIndexConcurrentlyWherePossible(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("suppressed_by", ""), _negated=True),
                fields=["suppressed_by", "-created_at"],
                include=["status"],
                name="notif_suppressed_by_idx",
            ),
        ),
    ]
