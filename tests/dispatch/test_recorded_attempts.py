"""The attempts the dispatcher records before delivering (one INSERT for a batch, on
PostgreSQL from one array of ids) are the rows in the database: the same values, each with its
own defaults, usable as any loaded row."""

import pytest
from django.db import connection
from django.db.models import Model
from django.utils import timezone

from notifications.dispatch.finish import delivery_attempts_record
from notifications.models import DeliveryAttempt
from tests.dispatch.conftest import queue

pytestmark = pytest.mark.django_db


def attributes(instance: Model) -> dict:
    return {name: value for name, value in instance.__dict__.items() if name != "_state"}


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
