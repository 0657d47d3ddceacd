"""Web processes of the previous release keep inserting notifications while a deployment
migrates (docs/deployment.md: migrate, then restart): every column added to the notifications
table after its first release is nullable or has a database default, so an INSERT that does not
name it still succeeds."""

from django.db.migrations.loader import MigrationLoader
from django.db.models import NOT_PROVIDED

from notifications.models import Notification


def test_every_column_added_since_the_first_release_is_nullable_or_has_a_database_default(db):
    loader = MigrationLoader(None, ignore_no_migrations=True)
    first = loader.project_state(("notifications", "0001_initial")).models["notifications", "notification"]
    original = set(first.fields)
    added = [field for field in Notification._meta.concrete_fields if field.name not in original]
    assert added, "the table has grown since 0001"
    missing = [field.name for field in added if not field.null and field.db_default is NOT_PROVIDED]
    assert missing == []
