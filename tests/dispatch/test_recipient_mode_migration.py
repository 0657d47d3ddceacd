"""Lists that existed before recipient modes become bcc: their members stop seeing each other."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("notifications", "0005_kpi_partial_indexes")]
AFTER = [("notifications", "0006_list_recipient_mode")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_makes_every_existing_list_bcc():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old_apps = executor.loader.project_state(BEFORE).apps
        old_apps.get_model("notifications", "NotificationList").objects.create(name="Shift A")

        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        new_apps = executor.loader.project_state(AFTER).apps
        shift_a = new_apps.get_model("notifications", "NotificationList").objects.get(name="Shift A")
        assert shift_a.recipient_mode == "bcc"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
