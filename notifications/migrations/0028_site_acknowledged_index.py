"""An index of each site's acknowledged notifications by acknowledgement time: every heartbeat of
an agent that takes acknowledgements looks up its site's acknowledgements of the last 24 hours
(sites.services)."""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    # Built CONCURRENTLY on PostgreSQL (no lock on a table of millions of rows), which cannot run
    # inside a transaction.
    atomic = False

    dependencies = [
        ("notifications", "0027_acknowledgement_indexes"),
    ]

    operations = [
        AddIndexConcurrentlyWherePossible(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("acknowledged_at__isnull", False)),
                fields=["source_site_id", "acknowledged_at"],
                name="notif_site_acknowledged_idx",
            ),
        ),
    ]
