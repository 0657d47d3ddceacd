"""Watchdogs at central: pings (POST /api/v1/sites/watchdogs/), their judgement (one notification
when a watchdog misses two intervals, one when it pings again, one per list when its site is
silent), retiring, and what the console shows. Time passes by judging at a later ``now``; the
notifications are real rows, raised through ingest as the site."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from notifications.clock import database_now
from notifications.ingest import notification_status_record
from notifications.models import Notification
from sites.models import Site, SiteHeartbeat, SiteSilence, Watchdog, WatchdogAlert
from sites.tasks import watchdogs_task
from sites.watchdogs import watchdogs_evaluate, watchdogs_retire
from tests.admin.conftest import login, make_user
from tests.dispatch.conftest import configure_smtp, run_pass
from tests.support.payloads import make_payload
from tests.support.smtp import SmtpServer

PINGS = "/api/v1/sites/watchdogs/"
NOTIFICATIONS = "/api/v1/notifications/"
HEARTBEAT = "/api/v1/sites/heartbeat/"
Kind = WatchdogAlert.Kind


def ping(api, name="pump-loop", *, every=60, list_name="Operators", **fields):
    return api.post(PINGS, {"name": name, "every_seconds": every, "list_name": list_name, **fields}, format="json")


def iso(moment):
    return moment.isoformat().replace("+00:00", "Z")


def raised(kind=None):
    """The notifications watchdogs raised (of ``kind``), as rows of the outbox."""
    alerts = WatchdogAlert.objects.all() if kind is None else WatchdogAlert.objects.filter(kind=kind)
    return list(Notification.objects.filter(pk__in=alerts.values("notification_id")).order_by("created_at"))


def priority(notification):
    """The notification's priority in the API's words (its status record)."""
    return notification_status_record(notification)["priority"]


def heard(site, at):
    """The site's agent's latest heartbeat arrived ``at``."""
    SiteHeartbeat.objects.update_or_create(site=site, defaults={"received_at": at, "buffered": 0, "parked": 0})


# --- pings ------------------------------------------------------------------------------------------


def test_a_first_ping_creates_the_watchdog_and_the_answer_says_its_state(api, site):
    response = ping(api, type="teams", pinged_at="2020-01-01T00:00:00Z")

    assert response.status_code == 200
    assert response.json() == {
        "name": "pump-loop",
        "state": "ok",
        "last_ping_at": "2020-01-01T00:00:00Z",
        "every_seconds": 60,
        "list_name": "Operators",
        "type": "teams",
    }
    watchdog = Watchdog.objects.get()
    assert (watchdog.site, watchdog.name, watchdog.every_seconds) == (site, "pump-loop", 60)


def test_a_ping_from_the_future_counts_as_now_and_an_older_ping_never_moves_the_last_ping_back(api, site):
    before = database_now()
    ping(api, pinged_at="2999-01-01T00:00:00Z")
    taken = Watchdog.objects.get().last_ping_at
    assert before <= taken <= database_now()

    answer = ping(api, pinged_at="2020-01-01T00:00:00Z", every=30, list_name="Shift-Leads").json()

    assert answer["last_ping_at"] == iso(taken)
    assert (answer["every_seconds"], answer["list_name"]) == (30, "Shift-Leads")  # the latest ping says them


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"name": "pump-loop", "list_name": "Operators"}, "every_seconds", "required"),
        ({"every_seconds": 60, "list_name": "Operators"}, "name", "required"),
        ({"name": "pump-loop", "every_seconds": 60}, "list_name", "required"),
        ({"name": "pump-loop", "every_seconds": 0, "list_name": "Operators"}, "every_seconds", "greater than or equal"),
        ({"name": "pump-loop", "every_seconds": 604801, "list_name": "Operators"}, "every_seconds", "less than"),
        ({"name": "pump-loop", "every_seconds": "60", "list_name": "Operators"}, "every_seconds", "valid integer"),
        ({"name": "pump\nloop", "every_seconds": 60, "list_name": "Operators"}, "name", "line breaks"),
        ({"name": "   ", "every_seconds": 60, "list_name": "Operators"}, "name", "blank"),
        ({"name": "x" * 201, "every_seconds": 60, "list_name": "Operators"}, "name", "200 characters"),
        ({"name": "pump-loop", "every_seconds": 60, "list_name": "Oper\x1bators"}, "list_name", "control"),
        ({"name": "pump-loop", "every_seconds": 60, "list_name": "Operators", "type": "fax"}, "type", "valid choice"),
        (
            {"name": "pump-loop", "every_seconds": 60, "list_name": "Operators", "pinged_at": "2026-11-21T10:00:00"},
            "pinged_at",
            "timezone",
        ),
        (
            {"name": "pump-loop", "every_seconds": 60, "list_name": "Operators", "pinged_at": "yesterday"},
            "pinged_at",
            "ISO-8601",
        ),
    ],
)
def test_a_bad_ping_is_refused_with_400_naming_the_field(api, site, body, field, words):
    response = api.post(PINGS, body, format="json")

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field] and words in " ".join(errors[field])
    assert not Watchdog.objects.exists()


def test_pings_have_a_rate_limit_of_their_own_apart_from_the_notifications(api, site, settings):
    # Budgets small enough to exhaust here, refilled so slowly that nothing comes back meanwhile.
    settings.OUTBOX_BATCH_MAX_ITEMS = 10
    settings.OUTBOX_SITE_RATE_LIMIT, settings.OUTBOX_SITE_RATE_BURST = 0.01, 10
    settings.OUTBOX_SITE_REQUEST_RATE_LIMIT, settings.OUTBOX_SITE_REQUEST_RATE_BURST = 0.01, 3  # each kind of call
    batch = {"notifications": [make_payload() for _ in range(10)]}
    assert api.post(f"{NOTIFICATIONS}batch/", batch, format="json").status_code == 200
    assert (
        api.post(NOTIFICATIONS, make_payload(), format="json").status_code == 429
    )  # the notifications' budget is spent

    assert [ping(api).status_code for _ in range(3)] == [200, 200, 200]  # pings still go through
    refused = ping(api)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1


def test_a_ping_needs_the_sites_key(client, site):
    assert client.post(PINGS, {"name": "x", "every_seconds": 60, "list_name": "Operators"}).status_code == 401


# --- missed, recovered -----------------------------------------------------------------------------


def test_a_watchdog_that_misses_two_intervals_raises_one_high_notification_for_its_list_and_channel(
    api, site, operators_list
):
    ping(api, every=60, type="email")
    pinged = Watchdog.objects.get().last_ping_at

    assert not watchdogs_evaluate(now=pinged + timedelta(seconds=119)).raised  # not yet two intervals
    report = watchdogs_evaluate(now=pinged + timedelta(seconds=121))
    watchdogs_evaluate(now=pinged + timedelta(seconds=600))
    watchdogs_evaluate(now=pinged + timedelta(hours=5))

    assert report.raised == {"silent": 1}
    (notification,) = raised()
    assert notification.subject == f"Watchdog plant-a/pump-loop silent since {iso(pinged.replace(microsecond=0))}"
    assert (notification.list_name, notification.type, priority(notification)) == ("Operators", "email", "high")
    assert notification.source_site_id == "plant-a" and notification.source_instance_id == "pump-loop"
    assert "none came for two intervals" in notification.body
    assert Watchdog.objects.get().state == Watchdog.State.SILENT
    # An ordinary row: delivered like any other.
    with SmtpServer() as smtp_server:
        configure_smtp(smtp_server)
        run_pass()
    assert smtp_server.count_by_notification_id() == {str(notification.pk): 1}


def test_a_silent_watchdog_that_pings_again_raises_one_normal_notification_at_once(api, site):
    ping(api)
    pinged = Watchdog.objects.get().last_ping_at
    watchdogs_evaluate(now=pinged + timedelta(minutes=5))

    answer = ping(api).json()
    ping(api)
    watchdogs_evaluate(now=database_now() + timedelta(seconds=30))

    assert answer["state"] == "ok"
    (recovered,) = raised(Kind.RECOVERED)
    assert recovered.subject == "Watchdog plant-a/pump-loop pinging again" and priority(recovered) == "normal"
    assert len(raised(Kind.SILENT)) == 1


def test_each_silence_is_an_episode_of_its_own(api, site):
    for _ in range(3):
        ping(api)
        watchdogs_evaluate(now=Watchdog.objects.get().last_ping_at + timedelta(minutes=5))
    ping(api)

    assert len(raised(Kind.SILENT)) == 3 and len(raised(Kind.RECOVERED)) == 3


def test_two_workers_judging_at_the_same_moment_raise_one_notification(transactional_db, api, site, postgres_only):
    ping(api)
    later = Watchdog.objects.get().last_ping_at + timedelta(minutes=5)
    start = threading.Barrier(2)
    errors = []

    def judge():
        try:
            start.wait()
            watchdogs_evaluate(now=later)
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connection.close()  # this thread's own connection

    workers = [threading.Thread(target=judge) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert errors == []
    assert len(raised(Kind.SILENT)) == 1


def test_the_worker_task_judges_every_watchdog_and_says_what_it_raised(api, site):
    ping(api, every=1, pinged_at="2020-01-01T00:00:00Z")
    assert watchdogs_task() == "watchdogs of 1 site(s) judged: 1 silent"
    assert watchdogs_task() == "watchdogs of 1 site(s) judged: nothing raised"


# --- judged against what the site could tell -------------------------------------------------------


def test_a_watchdog_is_not_silent_while_its_sites_agent_has_not_been_heard_from_since_its_deadline(api, site):
    ping(api, every=60)
    pinged = Watchdog.objects.get().last_ping_at
    heard(site, pinged + timedelta(seconds=5))  # then the link goes down: no heartbeat, no ping

    assert not watchdogs_evaluate(now=pinged + timedelta(seconds=200)).raised

    heard(site, pinged + timedelta(seconds=180))  # the site speaks again, and has no newer ping …
    assert not watchdogs_evaluate(now=pinged + timedelta(seconds=200)).raised
    heard(site, pinged + timedelta(seconds=210))  # … nor at its next heartbeat: the script is silent
    assert watchdogs_evaluate(now=pinged + timedelta(seconds=220)).raised == {"silent": 1}


def test_a_heartbeat_that_overtakes_the_ping_made_during_a_cut_raises_no_false_silence(api, site):
    ping(api, every=60)
    pinged = Watchdog.objects.get().last_ping_at
    heard(site, pinged)
    # The link is cut for five minutes; when it comes back, the agent's ping attempt is still
    # failing while its heartbeat gets through.
    back = pinged + timedelta(minutes=5)
    heard(site, back)
    assert not watchdogs_evaluate(now=back + timedelta(seconds=1)).raised

    ping(api, every=60, pinged_at=iso(back - timedelta(seconds=1)))  # the script pinged all along
    heard(site, back + timedelta(seconds=30))
    assert not watchdogs_evaluate(now=back + timedelta(seconds=31)).raised
    assert Watchdog.objects.get().state == Watchdog.State.OK


def test_a_site_that_falls_silent_raises_one_notification_per_list_instead_of_one_per_watchdog(api, site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    for name, list_name in (("pump-loop", "Operators"), ("tank-loop", "operators"), ("boiler", "Shift-Leads")):
        ping(api, name, every=10, list_name=list_name)
    last = database_now()
    heard(site, last)

    watchdogs_evaluate(now=last + timedelta(seconds=200))  # not silent yet, and no watchdog judged past the heartbeat
    report = watchdogs_evaluate(now=last + timedelta(seconds=301))
    watchdogs_evaluate(now=last + timedelta(seconds=900))

    assert report.raised == {"site_silent": 2}
    assert sorted(n.list_name for n in raised(Kind.SITE_SILENT)) == ["Operators", "Shift-Leads"]
    assert all(n.subject == f"Site plant-a silent since {iso(last.replace(microsecond=0))}" for n in raised())
    assert all(priority(n) == "high" for n in raised()) and not raised(Kind.SILENT)
    assert set(Watchdog.objects.values_list("state", flat=True)) == {"ok"}


def test_a_site_heard_from_again_raises_one_normal_notification_per_list_told_and_no_false_silence(api, site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    ping(api, "pump-loop", every=10)
    ping(api, "boiler", every=10, list_name="Shift-Leads")
    outage = database_now()
    heard(site, outage)
    watchdogs_evaluate(now=outage + timedelta(seconds=400))

    # The link is back: the agent forwards each watchdog's latest ping, made during the outage, first …
    back = database_now() + timedelta(seconds=420)
    ping(api, "pump-loop", every=10, pinged_at=iso(back - timedelta(seconds=1)))
    ping(api, "boiler", every=10, list_name="Shift-Leads", pinged_at=iso(back - timedelta(seconds=1)))
    heard(site, back)  # … then its heartbeat.
    report = watchdogs_evaluate(now=back + timedelta(seconds=5))
    watchdogs_evaluate(now=back + timedelta(seconds=10))

    assert report.raised == {"site_back": 2}
    assert sorted(n.list_name for n in raised(Kind.SITE_BACK)) == ["Operators", "Shift-Leads"]
    assert all(n.subject == "Site plant-a heard from again" and priority(n) == "normal" for n in raised(Kind.SITE_BACK))
    assert not raised(Kind.SILENT)
    assert SiteSilence.objects.get().back_at == back


def test_after_a_site_silence_a_watchdog_whose_ping_came_late_gets_one_interval_of_grace(api, site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    ping(api, every=60)
    outage = Watchdog.objects.get().last_ping_at
    heard(site, outage)
    watchdogs_evaluate(now=outage + timedelta(seconds=400))
    back = outage + timedelta(seconds=1000)
    heard(site, back)  # its heartbeat came back; the watchdog's ping did not make it first

    watchdogs_evaluate(now=back + timedelta(seconds=30))
    heard(site, back + timedelta(seconds=30))
    assert not watchdogs_evaluate(now=back + timedelta(seconds=31)).raised.get("silent")

    heard(site, back + timedelta(seconds=61))  # one interval on, the site speaks and still no ping
    watchdogs_evaluate(now=back + timedelta(seconds=62))
    heard(site, back + timedelta(seconds=91))
    assert watchdogs_evaluate(now=back + timedelta(seconds=92)).raised == {"silent": 1}


# --- retiring ---------------------------------------------------------------------------------------


def test_a_retired_watchdog_is_not_judged_and_a_later_ping_brings_it_back_but_an_older_one_does_not(
    api, site, admin_user
):
    ping(api, pinged_at="2020-01-01T00:00:00Z")
    watchdog = Watchdog.objects.get()
    assert watchdogs_retire(watchdog_ids=[watchdog.pk, watchdog.pk], user=admin_user) == (1, 0)
    assert watchdogs_retire(watchdog_ids=[watchdog.pk], user=admin_user) == (0, 1)

    assert not watchdogs_evaluate(now=database_now() + timedelta(days=1)).raised
    assert ping(api, pinged_at="2020-01-02T00:00:00Z").json()["state"] == "retired"  # made before it was retired
    assert ping(api).json()["state"] == "ok"  # the script runs again
    assert not raised()


# --- the console ------------------------------------------------------------------------------------


@pytest.fixture
def silent_watchdog(api, site):
    ping(api, "pump-loop", pinged_at="2020-01-01T00:00:00Z")
    ping(api, "tank-loop")
    watchdogs_evaluate()
    return Watchdog.objects.get(name="pump-loop")


def test_an_operator_sees_each_sites_watchdogs_with_state_and_last_ping_but_cannot_retire_them(client, silent_watchdog):
    login(client, make_user("olivia", groups=["Operators"]))

    listing = client.get(reverse("admin:sites_watchdog_changelist")).content.decode()
    page = client.get(reverse("admin:sites_watchdog_change", args=[silent_watchdog.pk])).content.decode()
    outbox = client.get(reverse("admin:notifications_notification_changelist")).content.decode()

    assert "watchdog-silent" in listing and "watchdog-ok" in listing and "2020-01-01 00:00:00" in listing
    assert "retire_selected" not in listing
    assert "Notifications raised" in page and str(raised(Kind.SILENT)[0].pk) in page
    assert 'id="silent-watchdogs-link"' in outbox and "1 watchdog silent" in outbox


def test_an_administrator_retires_a_watchdog_from_the_list_and_sees_watchdogs_on_the_site_page(
    client, site, silent_watchdog
):
    login(client, make_user("adam", groups=["Administrators"]))
    site_page = client.get(reverse("admin:sites_site_change", args=[site.pk])).content.decode()
    assert "pump-loop" in site_page and "watchdog-silent" in site_page

    response = client.post(
        reverse("admin:sites_watchdog_changelist"),
        {"action": "retire_selected", "_selected_action": [silent_watchdog.pk]},
        follow=True,
    )

    assert "Retired 1 watchdog(s)" in response.content.decode()
    silent_watchdog.refresh_from_db()
    assert (silent_watchdog.state, silent_watchdog.retired_by) == ("retired", "adam")


def test_the_watchdog_notifications_page_lists_what_was_raised_with_its_status_at_central(client, silent_watchdog):
    login(client, make_user("olivia", groups=["Operators"]))
    content = client.get(reverse("admin:sites_watchdogalert_changelist")).content.decode()
    assert "watchdog silent" in content and ">Pending</a>" in content


def test_an_inactive_site_is_not_judged(api, site):
    ping(api, pinged_at="2020-01-01T00:00:00Z")
    Site.objects.filter(pk=site.pk).update(active=False)
    assert not watchdogs_evaluate(now=timezone.now()).raised
