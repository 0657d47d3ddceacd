"""Q_BROKER_URL=redis://…: django-q2's Redis broker instead of the database, against a real
Redis server (OUTBOX_TEST_REDIS_URL, default redis://127.0.0.1:6379/0). Without a reachable
server these tests are skipped with the reason, unless OUTBOX_TEST_REDIS_REQUIRED=true (the
CI leg), where that is a failure. Each test uses a cluster name of its own, so runs sharing
the server never take each other's tasks."""

import os
import subprocess
import uuid

import pytest
import requests
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from notifications import tasks, trigger
from notifications.models import DispatchRequest, Notification
from tests.dispatch.conftest import configure_smtp
from tests.dispatch.test_drain import age_request, backlog_drained_by_two_clusters
from tests.support.payloads import make_payload
from tests.support.processes import Central, manage, poll, settings_refusal, stop

REDIS_URL = os.environ.get("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url():
    import redis

    client = redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("OUTBOX_TEST_REDIS_REQUIRED", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"Redis at {REDIS_URL} is required (OUTBOX_TEST_REDIS_REQUIRED) and unreachable: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); set OUTBOX_TEST_REDIS_URL")
    yield REDIS_URL
    client.close()


@pytest.fixture
def cluster_name(redis_url):
    import redis

    name = f"outbox-test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"django_q:{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_conf(redis_url, cluster_name, monkeypatch):
    """This process's django-q2 configuration switched to the Redis broker, as
    Q_BROKER_URL would set it; yields that broker."""
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", redis_url)
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name)
    broker = get_broker()
    yield broker
    broker.connection.close()


def test_the_trigger_queues_one_dispatch_task_in_redis_until_it_starts(db, smtp_config, redis_conf):
    broker = redis_conf
    assert broker.list_key == f"django_q:{Conf.CLUSTER_NAME}:q"
    assert trigger.dispatch_enqueue() is True
    assert trigger.dispatch_enqueue() is False  # one is waiting: coalesced
    assert broker.queue_size() == 1
    (payload,) = broker.connection.lrange(broker.list_key, 0, -1)
    task = SignedPackage.loads(payload)
    assert task["func"] == trigger.DISPATCH_TASK
    assert task["kwargs"]["request"] == DispatchRequest.objects.get().token
    assert not OrmQ.objects.exists()  # nothing went through the database broker
    broker.connection.lpop(broker.list_key)  # a worker takes it …
    assert trigger.dispatch_enqueue() is False  # … and until it starts, it is the waiting one
    tasks.dispatch_task(**task["kwargs"])
    assert trigger.dispatch_enqueue() is True
    assert broker.queue_size() == 1


def test_a_dispatch_task_that_redis_lost_is_asked_for_again(db, redis_conf):
    broker = redis_conf
    assert trigger.dispatch_enqueue() is True
    broker.connection.delete(broker.list_key)  # Redis restarted without persistence
    age_request(trigger.REQUEST_LOST_SECONDS)
    assert trigger.dispatch_enqueue() is True
    assert broker.queue_size() == 1


@pytest.mark.parametrize("url", ["postgres://127.0.0.1/q", "http://127.0.0.1:6379", "127.0.0.1:6379"])
def test_a_broker_url_that_is_not_redis_stops_the_process_naming_the_variable(url):
    stderr = settings_refusal(Q_BROKER_URL=url)
    assert "Environment variable Q_BROKER_URL must be a redis://, rediss:// or unix:// URL" in stderr


def test_the_database_stays_the_default_broker():
    from django.conf import settings

    assert settings.Q_CLUSTER["orm"] == "default" and "redis" not in settings.Q_CLUSTER


@pytest.mark.slow
def test_a_real_worker_on_the_redis_broker_delivers_what_sites_send(
    transactional_db, smtp_server, site_key, operators_list, redis_url, cluster_name
):
    """gunicorn queues dispatch tasks into Redis after ingest, a real ``qcluster`` takes them
    from there and delivers each notification exactly once. (This process keeps its trigger
    off: the configuration it saves would otherwise ask for a dispatch through its own broker,
    the database.)"""
    configure_smtp(smtp_server)
    broker = {"Q_BROKER_URL": redis_url, "OUTBOX_Q_CLUSTER_NAME": cluster_name}
    worker = manage("qcluster", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **broker)
    try:
        with Central(workers=1, OUTBOX_DISPATCH_TRIGGER="true", **broker) as central:
            sent = [make_payload() for _ in range(5)]
            for payload in sent:
                response = requests.post(
                    f"{central.url}/api/v1/notifications/",
                    json=payload,
                    headers={"Authorization": f"Api-Key {site_key}"},
                    timeout=10,
                )
                assert response.status_code == 201, response.text
            smtp_server.wait_for(5, timeout=30)
            poll(
                lambda: Notification.objects.filter(status=Notification.Status.DELIVERED).count() == 5,
                timeout=20,
                message="the worker did not record the deliveries",
            )
    finally:
        stop(worker, timeout=30)
    assert smtp_server.count_by_notification_id() == {payload["notification_id"]: 1 for payload in sent}
    assert not OrmQ.objects.exists()  # the tasks went through Redis, not the database


@pytest.mark.slow
def test_every_task_process_of_two_qclusters_on_redis_delivers_part_of_a_backlog(
    transactional_db, smtp_server, redis_url, cluster_name, redis_conf
):
    # As many rows as the database-broker twin of this test, for the same reason: 800 were
    # drained by three of the four processes in one CI run, before the last one took a task.
    delivered, pids = backlog_drained_by_two_clusters(
        smtp_server, count=2400, Q_BROKER_URL=redis_url, OUTBOX_Q_CLUSTER_NAME=cluster_name
    )
    assert set(delivered) == pids, f"deliveries per process {dict(delivered)}, task processes {sorted(pids)}"
    assert sum(delivered.values()) == 2400
    assert not OrmQ.objects.exists()  # the tasks went through Redis
