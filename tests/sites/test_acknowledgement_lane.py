"""Acknowledgements made at central travel back to the site's agent in heartbeat answers: only to
agents that take them, in a lane of their own beside the operators' Retry/Discard commands,
offered for 24 hours, one command per notification, never handed out again once the agent has
it, with the acknowledger masked as targets are for sites."""

import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from notifications.models import Notification
from sites.models import SiteCommand, SiteParkedNotification, WatchdogAlert
from sites.services import COMMANDS_PER_LANE, site_commands_issue
from tests.support.payloads import make_payload

HEARTBEAT = "/api/v1/sites/heartbeat/"
INGEST = "/api/v1/notifications/"


def heartbeat(*, capabilities=("acknowledged",)):
    return {"agent_version": "0.4.0", "buffered": 0, "parked": 0, "capabilities": list(capabilities)}


def ack_url(command_id):
    return f"/api/v1/sites/commands/{command_id}/ack/"


def commands(api, **fields):
    response = api.post(HEARTBEAT, heartbeat(**fields), format="json")
    assert response.status_code == 200, response.content
    return response.json()["commands"]


def acknowledged(api, *, via="link", by="olga.ortiz@plant-a.example.com", note="on my way", ago=timedelta(minutes=1)):
    """A notification plant-a raised, acknowledged at central ``ago`` before now; its id."""
    notification_id = make_payload()["notification_id"]
    assert api.post(INGEST, make_payload(notification_id=notification_id), format="json").status_code == 201
    Notification.objects.filter(pk=notification_id).update(
        acknowledged_at=timezone.now() - ago, acknowledged_via=via, acknowledged_by=by, acknowledged_note=note
    )
    return notification_id


@pytest.fixture
def parked_row(site):
    return SiteParkedNotification.objects.create(site=site, notification_id=uuid.uuid4(), subject="Pump 3 tripped")


def test_an_acknowledgement_made_at_central_reaches_the_site_masked_until_the_agent_takes_it(api, site):
    notification_id = acknowledged(api, by="olga.ortiz@plant-a.example.com", note="call +4930123456 if it trips again")

    (command,) = commands(api)
    assert command["action"] == "acknowledged"
    assert command["notification_id"] == notification_id
    assert command["acknowledged_via"] == "link"
    assert command["acknowledged_by"] == "o***@plant-a.example.com"
    assert command["note"] == "call +49***456 if it trips again"
    stored = Notification.objects.get(pk=notification_id).acknowledged_at
    assert stored is not None and command["acknowledged_at"] == stored.isoformat().replace("+00:00", "Z")

    # The answer may be lost on the way: the same command comes again until the agent confirms it.
    assert commands(api) == [command]
    taken = api.post(ack_url(command["id"]), {"result": "done", "detail": "stored at the site"}, format="json")
    assert taken.status_code == 200 and taken.json()["state"] == "done"
    assert commands(api) == []
    assert commands(api) == []
    assert SiteCommand.objects.filter(action="acknowledged").count() == 1


def test_an_agent_without_the_capability_gets_no_acknowledgements_and_an_upgraded_one_does(api, site):
    notification_id = acknowledged(api)

    assert commands(api, capabilities=()) == []
    assert not SiteCommand.objects.exists()
    (command,) = commands(api)
    assert command["notification_id"] == notification_id


def test_an_acknowledgement_by_the_site_itself_is_not_sent_back_to_it(api, site):
    acknowledged(api, via="site", by="HMI")

    assert commands(api) == []


def test_acknowledgements_of_other_sites_escalation_children_and_watchdog_alerts_stay_away(
    api, site, other_site, other_site_key
):
    from rest_framework.test import APIClient

    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_site_key}")
    acknowledged(other)
    child = acknowledged(api)
    Notification.objects.filter(pk=child).update(escalation_of=uuid.uuid4(), escalation_step=1)
    alert = acknowledged(api)
    WatchdogAlert.objects.create(site=site, kind="silent", notification_id=alert, list_name="Operators", type="email")

    assert commands(api) == []


def test_an_acknowledgement_older_than_24_hours_is_never_offered(api, site):
    acknowledged(api, ago=timedelta(hours=24, minutes=1))

    assert commands(api) == []


def test_an_acknowledgement_the_agent_did_not_take_within_24_hours_expires(api, site):
    acknowledged(api)
    (command,) = commands(api)
    # A day passes without the agent confirming it (its command acknowledgements failed).
    SiteCommand.objects.filter(pk=command["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert commands(api) == []
    expired = SiteCommand.objects.get(pk=command["id"])
    assert expired.state == SiteCommand.State.EXPIRED
    assert "24 hours" in expired.detail
    # Never created again for the same notification.
    assert commands(api) == []
    assert SiteCommand.objects.count() == 1
    # The agent's late confirmation is still recorded: the site has it after all.
    late = api.post(ack_url(command["id"]), {"result": "done", "detail": "stored at the site"}, format="json")
    assert late.json()["state"] == "done"


def test_acknowledgements_never_delay_or_displace_operator_commands(api, site, parked_row, settings):
    many = [acknowledged(api) for _ in range(COMMANDS_PER_LANE + 5)]
    extra_rows = [
        SiteParkedNotification.objects.create(site=site, notification_id=uuid.uuid4(), subject=f"row {n}")
        for n in range(COMMANDS_PER_LANE - 1)
    ]
    # The acknowledgements were there first; the operator's commands come after.
    commands(api)
    site_commands_issue(parked_ids=[parked_row.pk, *[row.pk for row in extra_rows]], action="retry", user=None)

    answer = commands(api)
    operator = [command for command in answer if command["action"] == "retry"]
    acks = [command for command in answer if command["action"] == "acknowledged"]
    assert len(operator) == COMMANDS_PER_LANE  # every pending Retry, as without acknowledgements
    assert answer[: len(operator)] == operator  # ahead of the acknowledgements
    assert len(acks) == COMMANDS_PER_LANE  # the acknowledgements' own lane, full
    # Oldest acknowledgement first; the rest come once these are taken.
    assert {command["notification_id"] for command in acks} == set(many[:COMMANDS_PER_LANE])
    for command in acks:
        api.post(ack_url(command["id"]), {"result": "done", "detail": "stored"}, format="json")
    rest = [command for command in commands(api) if command["action"] == "acknowledged"]
    assert {command["notification_id"] for command in rest} == set(many[COMMANDS_PER_LANE:])


def test_a_done_acknowledged_command_leaves_a_site_parked_row_alone(api, site, parked_row):
    # A row parked at the site that central also holds (forwarded earlier, say) and acknowledged.
    payload = make_payload(notification_id=str(parked_row.notification_id))
    assert api.post(INGEST, payload, format="json").status_code == 201
    Notification.objects.filter(pk=parked_row.notification_id).update(
        acknowledged_at=timezone.now(), acknowledged_via="console", acknowledged_by="shift-lead"
    )
    (command,) = commands(api)

    api.post(ack_url(command["id"]), {"result": "done", "detail": "stored"}, format="json")

    parked_row.refresh_from_db()
    assert parked_row.state == SiteParkedNotification.State.PARKED
    # And an operator may still Retry the row: the acknowledgement is not a pending command for it.
    (outcome,) = site_commands_issue(parked_ids=[parked_row.pk], action="retry", user=None)
    assert outcome.command is not None, outcome.error


def test_operators_see_acknowledged_commands_and_their_state_in_site_commands(api, site, admin_client):
    acknowledged(api, by="olga.ortiz@plant-a.example.com")
    (command,) = commands(api)
    SiteCommand.objects.filter(pk=command["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    commands(api)

    listing = admin_client.get("/admin/sites/sitecommand/?action__exact=acknowledged")
    page = admin_client.get(f"/admin/sites/sitecommand/{command['id']}/change/")

    assert listing.status_code == page.status_code == 200
    assert "Acknowledged" in listing.content.decode() and "Expired" in listing.content.decode()
    assert "olga.ortiz@plant-a.example.com" in page.content.decode()  # staff see who it was


def test_the_database_holds_one_acknowledged_command_per_notification_of_a_site(api, site):
    notification_id = acknowledged(api)
    commands(api)

    with pytest.raises(IntegrityError), transaction.atomic():
        SiteCommand.objects.create(site=site, notification_id=notification_id, action="acknowledged")
    # Retry and Discard commands of the same notification are not limited by it.
    SiteCommand.objects.create(site=site, notification_id=notification_id, action="retry")
    SiteCommand.objects.create(site=site, notification_id=notification_id, action="retry")


def test_acknowledged_commands_are_kept_30_days_after_their_offer_ended_then_deleted(api, site):
    acknowledged(api)
    (command,) = commands(api)
    api.post(ack_url(command["id"]), {"result": "done", "detail": "stored"}, format="json")
    SiteCommand.objects.filter(pk=command["id"]).update(expires_at=timezone.now() - timedelta(days=29))
    commands(api)
    assert SiteCommand.objects.filter(pk=command["id"]).exists()

    SiteCommand.objects.filter(pk=command["id"]).update(expires_at=timezone.now() - timedelta(days=31))
    commands(api)
    assert not SiteCommand.objects.filter(pk=command["id"]).exists()
