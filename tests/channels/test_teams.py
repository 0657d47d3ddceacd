"""Teams end to end over real HTTP: a Workflows-like endpoint that accepts Adaptive Card
messages, scripted to fail, refuse or hang."""

import pytest

from notifications.models import DeliveryAttempt, Notification, TeamsTarget
from tests.channels.conftest import configure_channel, make_due
from tests.dispatch.conftest import fresh, queue, run_pass
from tests.support.payloads import make_payload
from tests.support.receivers import Reply

Status = Notification.Status
WORKFLOW_PATH = "/workflows/abc123/triggers/manual/paths/invoke"


def workflow_url(receiver, path=WORKFLOW_PATH):
    return receiver.url(path) + "?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig=SECRETSIG"


def queue_teams(**overrides):
    overrides.setdefault("type", "teams")
    overrides.setdefault("list_name", "Channels")
    (notification,) = queue(**overrides)
    return notification


def test_the_card_has_subject_title_body_text_facts_and_a_link_to_the_console(channel_list, teams_receiver, settings):
    settings.OUTBOX_PUBLIC_URL = "https://outbox.example.com"
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    notification = queue_teams(
        subject="Pump 3 tripped",
        body="Overcurrent at 10:00.",
        type_data={"facts": {"Site": "Plant A", "Current": 41.5}},
    )
    assert run_pass().delivered == 1
    (request,) = teams_receiver.received
    card = request.json()["attachments"][0]["content"]
    title, text, facts = card["body"]
    assert (title["text"], title["weight"]) == ("Pump 3 tripped", "Bolder")
    assert text["text"] == "Overcurrent at 10:00."
    assert facts == {
        "type": "FactSet",
        "facts": [{"title": "Site", "value": "Plant A"}, {"title": "Current", "value": "41.5"}],
    }
    (action,) = card["actions"]
    assert action["url"] == f"https://outbox.example.com/admin/notifications/notification/{notification.pk}/change/"
    notification = fresh(notification)
    assert notification.status == Status.DELIVERED
    (target,) = notification.resolved_targets
    # The workflow's signature (in the query) is a secret: masked in the audit snapshot.
    assert "SECRETSIG" not in target["target"]
    assert target["target"] == teams_receiver.url(WORKFLOW_PATH) + "?***"
    assert (target["outcome"], target["http_status"]) == ("delivered", 202)


def test_facts_given_as_a_list_keep_their_order(channel_list, teams_receiver):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    queue_teams(type_data={"facts": [{"title": "B", "value": "2"}, {"title": "A", "value": "1"}]})
    run_pass()
    card = teams_receiver.received[0].json()["attachments"][0]["content"]
    assert card["body"][-1]["facts"] == [{"title": "B", "value": "2"}, {"title": "A", "value": "1"}]
    assert "actions" not in card  # no OUTBOX_PUBLIC_URL: no link


def test_facts_given_as_an_object_keep_the_order_sent_through_the_api(channel_list, teams_receiver, api):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    # PostgreSQL's jsonb would sort these keys (shorter first): Site before Pressure.
    payload = make_payload(type="teams", list_name="Channels", type_data={"facts": {"Pressure": "3 bar", "Site": "A"}})
    assert api.post("/api/v1/notifications/", payload, format="json").status_code == 201
    run_pass()
    card = teams_receiver.received[0].json()["attachments"][0]["content"]
    assert card["body"][-1]["facts"] == [{"title": "Pressure", "value": "3 bar"}, {"title": "Site", "value": "A"}]
    # The same submission again is a replay: the fingerprint is of what was sent.
    assert api.post("/api/v1/notifications/", payload, format="json").status_code == 200


def test_a_row_stored_before_facts_kept_their_order_still_replays_and_is_delivered(channel_list, teams_receiver, api):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    payload = make_payload(type="teams", list_name="Channels", type_data={"facts": {"Pressure": "3 bar", "Site": "A"}})
    assert api.post("/api/v1/notifications/", payload, format="json").status_code == 201
    # As such a row was stored: the object itself (never rewritten).
    Notification.objects.filter(pk=payload["notification_id"]).update(type_data=payload["type_data"])
    assert api.post("/api/v1/notifications/", payload, format="json").status_code == 200
    assert run_pass().delivered == 1
    facts = teams_receiver.received[0].json()["attachments"][0]["content"]["body"][-1]["facts"]
    assert sorted(fact["title"] for fact in facts) == ["Pressure", "Site"]


def test_a_503_then_success_is_retried_then_delivered(channel_list, teams_receiver):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    teams_receiver.script(WORKFLOW_PATH, [Reply(503), Reply(202)])
    notification = queue_teams()
    run_pass()
    assert fresh(notification).status == Status.RETRYING
    make_due(notification)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED


def test_a_429_is_throttled_and_waits_as_long_as_retry_after_says(channel_list, teams_receiver):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    teams_receiver.script(WORKFLOW_PATH, [Reply(429, headers={"Retry-After": "120"})])
    notification = queue_teams()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert (notification.next_attempt_at - notification.last_attempt_at).total_seconds() >= 119
    assert DeliveryAttempt.objects.get(notification=notification).failure_class == "throttled"


@pytest.mark.parametrize("status", [400, 404, 410])
def test_a_4xx_parks_the_notification(channel_list, teams_receiver, status):
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    teams_receiver.script(WORKFLOW_PATH, [Reply(status)])
    notification = queue_teams()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert f"HTTP {status}" in notification.last_error


def test_two_of_three_workflows_accept_and_the_third_is_retried_alone(channel_list, teams_receiver):
    for name in ("a", "b", "c"):
        TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver, f"/{name}"))
    teams_receiver.script("/c", [Reply(500), Reply(202)])
    notification = queue_teams()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.RETRYING
    assert sorted(entry["outcome"] for entry in notification.resolved_targets) == ["deferred", "delivered", "delivered"]
    make_due(notification)
    run_pass()
    assert fresh(notification).status == Status.DELIVERED
    assert sorted(request.path for request in teams_receiver.received) == ["/a", "/b", "/c", "/c"]


def test_a_workflow_slower_than_the_timeout_is_a_timeout(channel_list, teams_receiver):
    configure_channel("teams", timeout_seconds=1)
    TeamsTarget.objects.create(notification_list=channel_list, url=workflow_url(teams_receiver))
    teams_receiver.script(WORKFLOW_PATH, [Reply(202, delay=3)])
    notification = queue_teams()
    run_pass()
    assert fresh(notification).status == Status.RETRYING
    assert DeliveryAttempt.objects.get(notification=notification).failure_class == "timeout"


def test_a_list_without_teams_targets_parks_naming_the_list_and_the_channel(channel_list):
    notification = queue_teams()
    run_pass()
    notification = fresh(notification)
    assert notification.status == Status.PARKED
    assert "'Channels'" in notification.last_error and "teams" in notification.last_error
