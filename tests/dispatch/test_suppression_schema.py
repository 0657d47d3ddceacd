"""The schema and configuration of suppression: the status constraint (replaced NOT VALID, then
validated) takes Suppressed and still refuses other words; a list's suppression settings go
through the configuration file with clear problems for bad values."""

import pytest
from django.db import IntegrityError, connection, transaction

from notifications.config_file import configuration_import, configuration_validate
from notifications.models import Notification, NotificationList
from tests.admin.conftest import make_notification


def test_the_status_constraint_takes_suppressed_and_refuses_other_words(db):
    row = make_notification(status=Notification.Status.SUPPRESSED, suppressed_by="silence:1")
    assert Notification.objects.get(pk=row.pk).status == "Suppressed"
    with pytest.raises(IntegrityError), transaction.atomic():
        Notification.objects.filter(pk=row.pk).update(status="Muted")


def test_the_status_constraint_is_validated_after_the_migrations(postgres_only):
    with connection.cursor() as cursor:
        cursor.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'notif_status_valid'")
        assert cursor.fetchall() == [(True,)]


def lists_file(**settings):
    return {"lists": [{"name": "Operators", "email": ["op@example.com"], **settings}]}


def test_a_lists_suppression_settings_are_imported(db):
    configuration_import(data=lists_file(dedup_window_seconds=600, flood_threshold=10, flood_window_seconds=60))
    operators = NotificationList.objects.get(name="Operators")
    assert (operators.dedup_window_seconds, operators.flood_threshold, operators.flood_window_seconds) == (600, 10, 60)


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"dedup_window_seconds": -1}, "dedup_window_seconds: must be a whole number of at least 0"),
        ({"flood_threshold": "10"}, "flood_threshold: must be a whole number of at least 0"),
        ({"flood_window_seconds": 0}, "flood_window_seconds: must be a whole number of at least 1"),
        ({"flood_window_seconds": True}, "flood_window_seconds: must be a whole number of at least 1"),
    ],
)
def test_bad_suppression_settings_in_the_file_are_named(db, settings, words):
    problems = configuration_validate(data=lists_file(**settings))
    assert any(words in problem for problem in problems), problems
