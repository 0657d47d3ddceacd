"""The site API for agents' own state: heartbeats (answered with commands), parked reports and
command acknowledgements; and the site figures in the KPI endpoint."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from sites.models import SiteCommand, SiteHeartbeat, SiteParkedNotification
from sites.services import site_commands_issue
from tests.support.staff import staff_key_header

HEARTBEAT = "/api/v1/sites/heartbeat/"
PARKED = "/api/v1/sites/parked/"
Parked = SiteParkedNotification.State


def ack_url(command_id):
    return f"/api/v1/sites/commands/{command_id}/ack/"


def heartbeat(**fields):
    return {
        "agent_version": "0.3.0",
        "buffered": 12,
        "parked": 1,
        "oldest_buffered_at": "2026-11-21T10:00:00.000000Z",
        "last_forward_at": "2026-11-21T10:05:00.000000Z",
        "last_error": "",
        **fields,
    }


def parked_item(notification_id=None, **fields):
    return {
        "notification_id": str(notification_id or uuid.uuid4()),
        "type": "sms",
        "list_name": "Operators",
        "subject": "Pump 3 tripped",
        "source_instance_id": "Pump3",
        "source_script": "OnTrip",
        "site_enqueued_at": "2026-11-21T10:00:00.000000Z",
        "reason": "Rejected by central: HTTP 400: invalid: type: Unknown notification type 'sms'.",
        "retry_count": 0,
        "parked_at": "2026-11-21T10:00:01.000000Z",
        **fields,
    }


def issue(row, action, reason=""):
    """Issue one command for ``row``; the command (the test fails if none was issued)."""
    (outcome,) = site_commands_issue(parked_ids=[row.pk], action=action, user=None, reason=reason)
    assert outcome.command is not None, outcome.error
    return outcome.command


@pytest.fixture
def parked_row(site):
    return SiteParkedNotification.objects.create(site=site, notification_id=uuid.uuid4(), subject="Pump 3 tripped")


# --- heartbeats -------------------------------------------------------------------------------------


def test_a_heartbeat_is_stored_as_the_sites_latest_and_answered_with_no_commands(api, site):
    first = api.post(HEARTBEAT, heartbeat(buffered=12), format="json")
    second = api.post(HEARTBEAT, heartbeat(buffered=3, last_error="HTTP 503"), format="json")

    assert first.status_code == second.status_code == 200
    assert second.json() == {"commands": []}
    stored = SiteHeartbeat.objects.get(site=site)
    assert (stored.buffered, stored.parked, stored.agent_version, stored.last_error) == (3, 1, "0.3.0", "HTTP 503")
    assert stored.oldest_buffered_at is not None
    assert stored.oldest_buffered_at.isoformat() == "2026-11-21T10:00:00+00:00"


def test_pending_commands_ride_on_every_heartbeat_until_acknowledged(api, site, parked_row):
    command = issue(parked_row, "retry")
    expected = {
        "id": str(command.pk),
        "action": "retry",
        "notification_id": str(parked_row.notification_id),
        "reason": "",
    }

    assert api.post(HEARTBEAT, heartbeat(), format="json").json() == {"commands": [expected]}
    assert api.post(HEARTBEAT, heartbeat(), format="json").json() == {"commands": [expected]}
    assert SiteCommand.objects.get().sent_at is not None
    api.post(ack_url(command.pk), {"result": "done", "detail": "forwarding again"}, format="json")
    assert api.post(HEARTBEAT, heartbeat(), format="json").json() == {"commands": []}


def test_a_commands_reason_reaches_the_site_with_recipients_masked(api, site, parked_row):
    reason = "op1@example.com left; +4930123456 replaces https://hooks.example.com/alarms?sig=abc"
    issue(parked_row, "discard", reason)

    (command,) = api.post(HEARTBEAT, heartbeat(), format="json").json()["commands"]
    assert command["reason"] == "o***@example.com left; +49***456 replaces hooks.example.com"
    assert SiteCommand.objects.get().reason == reason  # kept as written for the console


def test_a_heartbeat_with_bad_fields_is_refused_field_by_field(api, site):
    response = api.post(HEARTBEAT, heartbeat(buffered=-1, oldest_buffered_at="yesterday"), format="json")

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"buffered", "oldest_buffered_at"}
    assert not SiteHeartbeat.objects.exists()


def test_a_heartbeat_that_is_not_an_object_is_a_400(api, site):
    response = api.post(HEARTBEAT, [1, 2], format="json")
    assert response.status_code == 400 and response.json()["error"] == "invalid"


def test_the_site_endpoints_need_a_site_key(client, db, other_site_key):
    assert client.post(HEARTBEAT, heartbeat(), content_type="application/json").status_code == 401
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Api-Key nope.nope")
    assert wrong.post(PARKED, {}, format="json").status_code == 401


# --- parked reports ---------------------------------------------------------------------------------


def test_a_parked_report_creates_rows_idempotently_and_updates_their_reason(api, site):
    item = parked_item()
    assert api.post(PARKED, {"parked": [item]}, format="json").json() == {"parked": 1, "unparked": 0}
    assert api.post(PARKED, {"parked": [{**item, "reason": "Retries exhausted"}]}, format="json").status_code == 200

    row = SiteParkedNotification.objects.get()
    assert (row.site, str(row.notification_id), row.state, row.reason) == (
        site,
        item["notification_id"],
        Parked.PARKED,
        "Retries exhausted",
    )
    assert (row.type, row.subject, row.source_script) == ("sms", "Pump 3 tripped", "OnTrip")


def test_an_unparked_report_heals_centrals_view_and_an_unknown_one_is_ignored(api, site):
    kept, retried = parked_item(), parked_item()
    api.post(PARKED, {"parked": [kept, retried]}, format="json")

    response = api.post(
        PARKED,
        {
            "unparked": [
                {"notification_id": retried["notification_id"], "outcome": "retried"},
                {"notification_id": str(uuid.uuid4()), "outcome": "discarded"},
            ]
        },
        format="json",
    )

    assert response.json() == {"parked": 0, "unparked": 1}
    states = dict(SiteParkedNotification.objects.values_list("notification_id", "state"))
    assert {str(k): v for k, v in states.items()} == {
        kept["notification_id"]: Parked.PARKED,
        retried["notification_id"]: Parked.RETRIED,
    }


def test_text_longer_than_centrals_columns_is_cut_not_refused(api, site):
    # An over-long type is one reason a row parks at the site; its report must still arrive.
    response = api.post(PARKED, {"parked": [parked_item(type="t" * 500, subject="s" * 300)]}, format="json")

    assert response.status_code == 200
    row = SiteParkedNotification.objects.get()
    assert len(row.type) == 64 and row.type.endswith("…") and len(row.subject) == 255


def test_a_report_with_a_bad_item_is_refused_and_names_the_item(api, site):
    response = api.post(PARKED, {"parked": [parked_item(), {"notification_id": "nope"}]}, format="json")

    assert response.status_code == 400
    assert set(response.json()["errors"]["parked"]) == {"1"}
    assert "notification_id" in response.json()["errors"]["parked"]["1"]
    assert not SiteParkedNotification.objects.exists()


def test_a_site_cannot_report_another_sites_notification_as_parked_at_itself(api, site, other_site):
    from tests.dispatch.conftest import queue

    (theirs,) = queue(site_id=other_site.site_id)
    (ours,) = queue(site_id=site.site_id)
    report = {"parked": [parked_item(ours.pk), parked_item(theirs.pk), parked_item()]}

    response = api.post(PARKED, report, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "parked": {
            "1": {
                "notification_id": [
                    "Central holds a notification with this id for another site; a site reports only its own."
                ]
            }
        }
    }
    assert not SiteParkedNotification.objects.exists()  # nothing of the report is stored
    # Its own notification, which central holds too (central refused a retry, say), is accepted.
    assert api.post(PARKED, {"parked": [parked_item(ours.pk)]}, format="json").status_code == 200


def test_one_site_cannot_report_or_see_anothers_rows(api, site, other_site, other_site_key, parked_row):
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    item = parked_item(parked_row.notification_id)
    other.post(PARKED, {"parked": [item]}, format="json")
    other.post(
        PARKED,
        {"unparked": [{"notification_id": str(parked_row.notification_id), "outcome": "discarded"}]},
        format="json",
    )

    parked_row.refresh_from_db()
    assert parked_row.state == Parked.PARKED  # plant-a's row is untouched
    assert SiteParkedNotification.objects.filter(site=other_site).count() == 1


# --- acknowledgements ---------------------------------------------------------------------------------


def test_an_acknowledgement_records_the_result_and_the_first_one_wins(api, site, parked_row):
    command = issue(parked_row, "discard", "test rig")

    first = api.post(ack_url(command.pk), {"result": "done", "detail": "discarded at the site"}, format="json")
    again = api.post(ack_url(command.pk), {"result": "failed", "detail": "not parked"}, format="json")

    assert first.status_code == again.status_code == 200
    assert again.json()["state"] == "done" and again.json()["detail"] == "discarded at the site"
    parked_row.refresh_from_db()
    assert parked_row.state == Parked.DISCARDED


def test_a_failed_command_leaves_the_row_parked(api, site, parked_row):
    command = issue(parked_row, "retry")

    api.post(ack_url(command.pk), {"result": "failed", "detail": "not in this site's buffer"}, format="json")

    parked_row.refresh_from_db()
    assert parked_row.state == Parked.PARKED
    assert SiteCommand.objects.get().state == SiteCommand.State.FAILED


def test_acknowledging_another_sites_or_an_unknown_command_is_a_404(api, site, other_site_key, parked_row):
    command = issue(parked_row, "retry")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")

    assert other.post(ack_url(command.pk), {"result": "done"}, format="json").status_code == 404
    assert api.post(ack_url(uuid.uuid4()), {"result": "done"}, format="json").status_code == 404
    assert SiteCommand.objects.get().state == SiteCommand.State.PENDING


def test_an_acknowledgement_with_an_unknown_result_is_a_400(api, site, parked_row):
    command = issue(parked_row, "retry")
    response = api.post(ack_url(command.pk), {"result": "maybe"}, format="json")
    assert response.status_code == 400 and "result" in response.json()["errors"]


# --- issuing commands ---------------------------------------------------------------------------------


def test_issuing_the_same_action_twice_keeps_one_pending_command(site, parked_row):
    first = site_commands_issue(parked_ids=[parked_row.pk], action="retry", user=None)
    second = site_commands_issue(parked_ids=[parked_row.pk], action="retry", user=None)
    assert first[0].command == second[0].command and SiteCommand.objects.count() == 1


def test_a_discard_while_a_retry_is_pending_or_of_a_row_no_longer_parked_is_refused(site, parked_row):
    site_commands_issue(parked_ids=[parked_row.pk], action="retry", user=None)
    (pending,) = site_commands_issue(parked_ids=[parked_row.pk], action="discard", user=None, reason="r")
    parked_row.state = Parked.RETRIED
    parked_row.save()
    SiteCommand.objects.update(state=SiteCommand.State.DONE)
    (left,) = site_commands_issue(parked_ids=[parked_row.pk], action="retry", user=None)

    assert pending.command is None and "Retry is already pending" in pending.error
    assert left.command is None and "no longer parked at the site" in left.error


def test_a_discard_needs_a_reason(site, parked_row):
    from sites.services import SiteCommandError

    with pytest.raises(SiteCommandError, match="needs a reason"):
        site_commands_issue(parked_ids=[parked_row.pk], action="discard", user=None, reason="  ")
    assert not SiteCommand.objects.exists()


# --- KPIs ---------------------------------------------------------------------------------------------


def staff_token(username):
    """The ``Authorization`` header of a staff user's API token (the KPI endpoint takes tokens)."""
    user = User.objects.create_user(username, is_staff=True)
    return staff_key_header(user)


def test_the_kpi_endpoint_has_each_sites_backlog_parked_at_site_and_silence(client, api, site, other_site, settings):
    settings.OUTBOX_SITE_SILENT_AFTER = 300
    boss = staff_token("boss")
    api.post(HEARTBEAT, heartbeat(buffered=12, parked=2), format="json")
    SiteHeartbeat.objects.create(
        site=other_site, received_at=timezone.now() - timedelta(minutes=6), buffered=4, parked=0
    )

    kpis = client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=boss).json()

    plant_a, plant_b = kpis["per_site"]["plant-a"], kpis["per_site"]["plant-b"]
    assert (plant_a["site_backlog"], plant_a["parked_at_site"], plant_a["silent"]) == (12, 2, False)
    assert (plant_b["site_backlog"], plant_b["parked_at_site"], plant_b["silent"]) == (4, 0, True)
    assert plant_a["queue_depth"] == 0 and plant_a["oldest_pending_age_seconds"] is None
    assert {key: kpis["global"][key] for key in ("site_backlog", "parked_at_site", "silent_sites")} == {
        "site_backlog": 16,
        "parked_at_site": 2,
        "silent_sites": 1,
    }


def test_a_site_whose_agent_never_heart_beated_is_direct_never_silent_with_its_last_post(client, api, site, payload):
    api.post("/api/v1/notifications/", payload, format="json")  # it posts directly, no agent heartbeats
    kpis = client.get("/api/v1/kpis/", HTTP_AUTHORIZATION=staff_token("boss")).json()
    plant_a = kpis["per_site"]["plant-a"]
    assert plant_a == {
        **plant_a,
        "site_backlog": None,
        "parked_at_site": None,
        "silent": False,
        "last_heartbeat_at": None,
        "direct": True,
    }
    assert plant_a["last_seen_at"].startswith(str(timezone.now().year)) and kpis["global"]["silent_sites"] == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"buffered": "12"},
        {"parked": True},
        {"last_error": 0},
        {"agent_version": "0.3\x00"},
        {"last_error": "\ud800"},
    ],
)
def test_a_heartbeat_field_of_the_wrong_json_type_or_bad_text_is_a_400(api, site, fields):
    response = api.post(HEARTBEAT, heartbeat(**fields), format="json")
    assert response.status_code == 400 and set(response.json()["errors"]) == set(fields)


def test_a_notification_id_that_is_not_a_uuid_string_is_a_400(api, site):
    response = api.post(PARKED, {"unparked": [{"notification_id": False, "outcome": "retried"}]}, format="json")
    assert response.status_code == 400
