"""Partial deliveries counted apart (notifications.counts): the dashboard's "delivered
partially" series, and a failed series that leaves out the attempts that failed for some
recipients while others had the notification.

- ``DeliveryAttempt.targets_delivered``: how many targets had the notification once the
  attempt ended (the dispatcher records it from now on; 0 on every earlier attempt).
- ``partial`` in the keys of the notification counts (a Delivered row some target refused for
  good) and of the failed-attempt counts (an attempt that failed while some targets had it).

Safe on a large table: every new column has a constant default and no check (PostgreSQL adds
it without rewriting or scanning the table). Nothing is recounted: the triggers' functions are
replaced and only the Delivered rows with refusals are moved to their own keys, read through
their partial index (notif_partial_idx, 0008), with writers of notifications held off
meanwhile (readers go on; on ten million rows, 232,421 of them partial: 32 s in all).
Notifications are locked first, before the attempts' table is
altered, in the order the dispatcher takes them, so that the two never wait on each other.
SQLite keeps no counts: it gets the columns only.
"""

from django.db import migrations, models

from notifications.counts import NOTIFICATIONS, counts_partial_install, counts_partial_uninstall


def lock_notifications(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"LOCK TABLE {NOTIFICATIONS} IN SHARE ROW EXCLUSIVE MODE")


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        counts_partial_install(schema_editor)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        counts_partial_uninstall(schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0035_console_recipient_search_index"),
    ]

    operations = [
        migrations.RunPython(lock_notifications, lock_notifications),
        migrations.AddField(
            model_name="deliveryattempt",
            name="targets_delivered",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="failedattemptcount",
            name="partial",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="notificationcount",
            name="partial",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.RunPython(install, uninstall),
    ]
