"""The worker side: the coalesced trigger, django-q2 tasks and schedules, the commands."""

import signal
import smtplib
import subprocess
import sys
import time
from email.message import EmailMessage

import pytest
from django.core.management import call_command
from django.utils.module_loading import import_string
from django_q.conf import Conf
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage

from notifications import schedules, tasks, trigger
from notifications.models import DeliveryAttempt, EmailRecipient, Notification, NotificationList
from tests.dispatch.conftest import configure_smtp, queue
from tests.support.processes import ROOT, child_env, manage, poll
from tests.support.smtp import closed_port

Status = Notification.Status


def queued_dispatch_tasks():
    return [
        p
        for p in OrmQ.objects.filter(key=Conf.CLUSTER_NAME).values_list("payload", flat=True)
        if SignedPackage.loads(p)["func"] == trigger.DISPATCH_TASK
    ]


def make_operators():
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
    return operators


# --- trigger and tasks ------------------------------------------------------------------------


@pytest.mark.dispatch_trigger
def test_a_burst_of_ingests_queues_one_dispatch_task_while_none_is_picked_up(transactional_db):
    for _ in range(300):
        queue()
    poll(lambda: len(queued_dispatch_tasks()) >= 1, timeout=5, message="no dispatch task was queued")
    time.sleep(trigger.TRIGGER_DEBOUNCE * 4)  # let the trigger thread act on the last requests
    assert len(queued_dispatch_tasks()) == 1


def queued_dispatch_requests():
    """The request tokens of the dispatch tasks waiting in the database broker."""
    return [SignedPackage.loads(p)["kwargs"].get("request") for p in queued_dispatch_tasks()]


def test_a_new_task_is_queued_once_the_waiting_one_has_started(db):
    assert trigger.dispatch_enqueue() is True
    assert trigger.dispatch_enqueue() is False  # one is waiting: coalesced
    (token,) = queued_dispatch_requests()
    tasks.dispatch_task(request=token)  # a worker runs it: the request is cleared as it starts
    assert trigger.dispatch_enqueue() is True
    assert len(queued_dispatch_tasks()) == 2


def test_a_waiting_purge_task_does_not_swallow_a_dispatch_request(db):
    from django_q.tasks import async_task

    async_task(schedules.PURGE_TASK)
    assert trigger.dispatch_enqueue() is True


def test_the_task_paths_queued_and_scheduled_name_the_worker_tasks():
    # Brokers and schedules in existing databases keep these dotted paths: they must not move.
    assert trigger.DISPATCH_TASK == "notifications.tasks.dispatch_task"
    assert schedules.PURGE_TASK == "notifications.tasks.purge_task"
    assert import_string(trigger.DISPATCH_TASK) is tasks.dispatch_task
    assert import_string(schedules.PURGE_TASK) is tasks.purge_task


def fresh_process_output(code):
    """What ``code`` prints when run by a fresh Python process with Django set up."""
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        check=False,
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_web_processes_do_not_import_the_worker():
    """Loading every URL, view and admin page (what gunicorn serves) imports neither the
    dispatcher nor the tasks."""
    code = (
        "import sys; from django.urls import get_resolver; get_resolver().url_patterns; "
        "import notifications.api, notifications.admin, notifications.ingest; "
        "print(sorted(m for m in ('notifications.dispatch', 'notifications.tasks') if m in sys.modules))"
    )
    assert fresh_process_output(code) == "[]"


def test_tasks_are_time_boxed_below_the_task_timeout_and_the_broker_lease():
    assert tasks.task_time_budget() < Conf.TIMEOUT < Conf.RETRY


def test_a_dispatcher_process_hands_its_start_up_to_the_permanent_generation_once():
    code = (
        "import gc; from notifications.dispatch.runner import dispatcher_process_settle; "
        "before = gc.get_freeze_count(); first = dispatcher_process_settle(); frozen = gc.get_freeze_count(); "
        "second = dispatcher_process_settle(); "
        "print(before, first, frozen > 10000, second, gc.get_freeze_count() == frozen)"
    )
    assert fresh_process_output(code).split() == ["0", "True", "True", "False", "True"]


def settles(monkeypatch, module):
    """Record the calls of ``module``'s dispatcher_process_settle (and leave this test process's
    garbage collector as it is)."""
    calls = []
    monkeypatch.setattr(module, "dispatcher_process_settle", lambda: calls.append(1))
    return calls


def test_dispatch_task_delivers_and_queues_a_follow_up_when_time_runs_out(smtp_server, smtp_config, monkeypatch):
    make_operators()
    queue(3)
    settled = settles(monkeypatch, tasks)
    assert "delivered 3" in tasks.dispatch_task()
    assert settled == [1]
    assert smtp_server.count == 3
    queue(2)
    monkeypatch.setattr(tasks, "task_time_budget", lambda: 0)
    tasks.dispatch_task()
    assert len(queued_dispatch_tasks()) == 1


def test_setup_schedules_is_idempotent(db, capsys):
    Schedule.objects.all().delete()  # migrate created them; start as a database without them
    call_command("setup_schedules")
    assert capsys.readouterr().out.count(": created") == 3
    call_command("setup_schedules")
    assert capsys.readouterr().out.count(": unchanged") == 3
    sweep = Schedule.objects.get(name="outbox: dispatch sweep")
    assert (sweep.func, sweep.schedule_type, sweep.minutes, sweep.repeats) == (trigger.DISPATCH_TASK, "I", 1, -1)
    purge = Schedule.objects.get(name="outbox: retention purge")
    assert (purge.func, purge.schedule_type) == (schedules.PURGE_TASK, Schedule.DAILY)
    watchdogs = Schedule.objects.get(name="outbox: watchdogs")
    assert (watchdogs.func, watchdogs.schedule_type, watchdogs.minutes) == ("sites.tasks.watchdogs_task", "I", 1)
    Schedule.objects.filter(pk=sweep.pk).update(minutes=5)
    call_command("setup_schedules")
    assert "dispatch sweep (notifications.tasks.dispatch_task): updated" in capsys.readouterr().out
    assert Schedule.objects.count() == 3


@pytest.mark.slow
@pytest.mark.dispatch_trigger
def test_an_ingested_notification_is_delivered_by_the_worker_within_seconds(transactional_db, smtp_server, api):
    configure_smtp(smtp_server)
    make_operators()
    worker = manage("qcluster")
    try:
        from tests.support.payloads import make_payload

        payload = make_payload()
        started = time.monotonic()
        assert api.post("/api/v1/notifications/", payload, format="json").status_code == 201
        smtp_server.wait_for(1, timeout=20)
        elapsed = time.monotonic() - started
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert smtp_server.count_by_notification_id() == {payload["notification_id"]: 1}
    poll(
        lambda: Notification.objects.get(pk=payload["notification_id"]).status == Status.DELIVERED,
        timeout=10,
        message="the row was not marked Delivered",
    )
    print(f"ingest → SMTP server through qcluster: {elapsed:.2f} s")


# --- commands ---------------------------------------------------------------------------------


def test_dispatch_once_delivers_everything_due_and_reports(smtp_server, smtp_config, capsys, monkeypatch):
    from notifications.management.commands import dispatch as dispatch_command

    make_operators()
    queue(12)
    settled = settles(monkeypatch, dispatch_command)
    call_command("dispatch", "--once", "--batch-size", "5")
    assert settled == [1]
    out = capsys.readouterr().out
    assert "pass: claimed 12, delivered 12" in out
    assert "dispatch finished: delivered 12, retrying 0, parked 0" in out
    assert smtp_server.count == 12


@pytest.mark.slow
def test_dispatch_loop_stops_on_sigterm_finishing_the_attempts_in_flight(transactional_db, smtp_server):
    configure_smtp(smtp_server)
    make_operators()
    smtp_server.behave("accept", delay_seconds=0.5)
    queue(20)
    worker = manage("dispatch", "--concurrency", "2", "--batch-size", "20")
    poll(lambda: smtp_server.connections >= 2, timeout=20, message="the dispatcher never connected")
    worker.send_signal(signal.SIGTERM)
    _out, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert "stopping: finishing deliveries in flight" in err
    delivered = Notification.objects.filter(status=Status.DELIVERED).count()
    assert delivered == smtp_server.count >= 2  # what was in flight finished and was recorded
    assert Notification.objects.filter(status=Status.PENDING, claimed_by="").count() == 20 - delivered
    assert not DeliveryAttempt.objects.filter(outcome="in_progress").exists()
    assert DeliveryAttempt.objects.count() == delivered


@pytest.mark.slow
def test_smtp_catcher_saves_every_message_under_the_maildir(tmp_path):
    port = closed_port()
    catcher = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "smtp_catcher", "--port", str(port), "--maildir", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert catcher.stdout is not None
        assert "listening" in catcher.stdout.readline()
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = "a@example.com", "b@example.com", "Hello"
        message["X-Notification-Id"] = "6f1c3a52-0f7e-4a4e-9d8e-3f1b2c4d5e6f"
        message.set_content("Body")
        with smtplib.SMTP("127.0.0.1", port, timeout=5) as smtp:
            smtp.send_message(message)
        poll(lambda: list(tmp_path.glob("*.eml")), timeout=5, message="no message saved")
    finally:
        catcher.send_signal(signal.SIGTERM)
        catcher.communicate(timeout=10)
    (saved,) = tmp_path.glob("*.eml")
    assert "6f1c3a52-0f7e-4a4e-9d8e-3f1b2c4d5e6f" in saved.name
    assert b"Subject: Hello" in saved.read_bytes()
    assert catcher.returncode == 0
