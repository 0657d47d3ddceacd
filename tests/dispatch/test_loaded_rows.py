"""Notifications loaded from the database, and the attempts the dispatcher records, are built
without ``Model.__init__`` (notifications.db.instance_loaded): each must be the instance Django
builds — the same attributes, the same deferred fields, loaded and saved the same way — and a
model with ``post_init`` receivers keeps Django's path."""

import pytest
from django.db import connection
from django.db.models import Model
from django.db.models.signals import post_init
from django.utils import timezone

from notifications.dispatch import CLAIM_FIELDS, delivery_attempts_record
from notifications.models import DeliveryAttempt, Notification
from tests.dispatch.conftest import queue

pytestmark = pytest.mark.django_db


def django_built(names: list[str], values: tuple) -> Notification:
    """The instance Django's own ``Model.from_db`` builds for the same row."""
    return Model.from_db.__func__(Notification, connection.alias, names, values)  # type: ignore[attr-defined]


def attributes(instance: Model) -> dict:
    return {name: value for name, value in instance.__dict__.items() if name != "_state"}


@pytest.mark.parametrize("fields", [None, list(dict.fromkeys(CLAIM_FIELDS))], ids=["whole row", "the claim's columns"])
def test_a_loaded_row_is_the_instance_django_builds(fields):
    (row,) = queue(subject="Pump 3 tripped", type_data={"cc": ["shift@example.com"]})
    rows = Notification.objects.filter(pk=row.pk)
    loaded = (rows.only(*fields) if fields else rows).get()
    # Django hands the loaded columns over in the model's order.
    names = [field.attname for field in Notification._meta.concrete_fields if not fields or field.attname in fields]
    reference = django_built(names, tuple(getattr(loaded, name) for name in names))

    assert type(loaded) is Notification
    assert attributes(loaded) == attributes(reference)
    assert loaded.get_deferred_fields() == reference.get_deferred_fields()
    assert (loaded._state.adding, loaded._state.db) == (False, connection.alias)
    assert loaded == row
    assert loaded.type_data == {"cc": ["shift@example.com"]}  # JSON decoded as Django decodes it


def test_a_deferred_field_is_read_on_first_access_and_a_save_updates_the_row():
    (row,) = queue(subject="Pump 3 tripped")
    loaded = Notification.objects.only("notification_id", "status").get(pk=row.pk)
    assert "last_error" in loaded.get_deferred_fields()

    assert loaded.subject == "Pump 3 tripped"  # read now, from the database
    loaded.last_error = "edited"
    loaded.save(update_fields=["last_error"])

    assert Notification.objects.count() == 1  # an update, never a second row
    assert Notification.objects.get(pk=row.pk).last_error == "edited"


def test_a_post_init_receiver_keeps_djangos_path_and_runs():
    (row,) = queue()
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(receiver, sender=Notification)
    try:
        loaded = Notification.objects.get(pk=row.pk)
    finally:
        post_init.disconnect(receiver, sender=Notification)

    assert seen == [row.pk]
    assert attributes(loaded) == attributes(Notification.objects.get(pk=row.pk))


def test_recorded_attempts_are_the_rows_in_the_database_each_with_its_own_defaults():
    rows = queue(3)
    now = timezone.now()

    attempts = delivery_attempts_record(worker_id="dispatch:test", notifications=rows, now=now)

    assert list(attempts) == [row.pk for row in rows]  # in the order of the rows
    for row in rows:
        recorded = attempts[row.pk]
        stored = DeliveryAttempt.objects.get(pk=recorded.pk)
        assert attributes(recorded) == attributes(stored)
        assert (recorded._state.adding, recorded._state.db) == (False, connection.alias)
        assert (recorded.outcome, recorded.worker, recorded.started_at) == ("in_progress", "dispatch:test", now)
    first, second, _ = attempts.values()
    first.detail["probe"] = True
    assert second.detail == {}  # a callable default is called for every object, never shared


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL arrays")
def test_uuid_arrays_go_as_one_literal_and_read_back_as_the_same_ids(db):
    import uuid

    from notifications.db import uuid_array_literal

    ids = [uuid.uuid4() for _ in range(5)]
    assert uuid_array_literal([]) is None and uuid_array_literal([*ids, "not a uuid"]) is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(%s AS uuid[])", [uuid_array_literal(ids)])
        assert cursor.fetchone()[0] == ids
