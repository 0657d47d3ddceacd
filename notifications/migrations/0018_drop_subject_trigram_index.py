"""Drops the trigram index on the subject alone (0002). Since 0012 the console's search looks in
five columns through its own index (now 0016's), and nothing searches the subject alone: the
index only cost every insert and update (a new row version adds the subject's trigrams) and
disk (276 MB at 10,000,000 rows). PostgreSQL only; the reverse builds it again.
"""

from django.db import migrations


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS notif_subject_trgm_idx")


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS notif_subject_trgm_idx ON notifications_notification USING gin (subject gin_trgm_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [("notifications", "0017_failed_attempt_counts_by_class")]
    operations = [migrations.RunPython(drop, create)]
