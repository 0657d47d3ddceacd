"""A stable code for failures the console acts on (a row's failure_code) and the small index of
the Parked rows that have one."""

from django.db import migrations, models

from notifications.migration_operations import AddIndexConcurrentlyWherePossible


class Migration(migrations.Migration):
    # The index is built CONCURRENTLY on PostgreSQL (no lock on a table of millions of rows),
    # which cannot run inside a transaction; the column has a database default, so the previous
    # release keeps inserting while the deployment migrates.
    atomic = False

    dependencies = [
        ("notifications", "0032_suppression_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="notification",
            name="failure_code",
            field=models.CharField(
                blank=True,
                choices=[
                    ("unknown_list", "the notification's list does not exist"),
                    ("no_recipients", "the list has no recipients on the channel"),
                ],
                db_default="",
                default="",
                max_length=32,
            ),
        ),
        AddIndexConcurrentlyWherePossible(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("status", "Parked"), models.Q(("failure_code", ""), _negated=True)),
                fields=["failure_code", "list_name"],
                name="notif_parked_code_idx",
            ),
        ),
    ]
