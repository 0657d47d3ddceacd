"""The forwarder against a programmable HTTP server on 127.0.0.1 (tests/agent/fake_central.py).

A stand-in for central is used on purpose: these tests are about answers and faults the real
central does not give on demand (503, 429 + Retry-After, 413 for a batch, 401 in the middle of a
backlog, timeouts, connection resets, stale keep-alive connections). The agent still talks real
HTTP over a real socket; only the other end is scripted.
"""

import json
import logging
import socket
import threading
import uuid

import pytest

from sites.agent import CentralUnreachable, CredentialRejected
from tests.agent.conftest import send_many
from tests.agent.fake_central import GOOD_KEY, Hang, Reply, Reset


def stored_row(outbox, notification_id):
    return outbox.buffer.get(notification_id)


# --- acknowledgement ----------------------------------------------------------------------------


def test_row_is_deleted_only_after_central_acknowledges(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    seen_while_posting = []

    def answer(received):
        seen_while_posting.append(stored_row(outbox, notification_id) is not None)
        central._ingest(received.body)
        return Reply(201, central.status_record(notification_id))

    central.then(answer)
    result = outbox.forward_once()

    assert seen_while_posting == [True]
    assert result.forwarded == 1
    assert stored_row(outbox, notification_id) is None


def test_a_single_row_is_posted_as_stored_with_the_site_key(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    stored_payload = json.loads(stored_row(outbox, notification_id).payload)

    outbox.forward_once()

    (received,) = central.requests
    assert (received.method, received.path) == ("POST", "/api/v1/notifications/")
    assert received.headers["Authorization"] == f"Api-Key {GOOD_KEY}"
    assert received.headers["Content-Type"] == "application/json"
    assert received.body == stored_payload
    assert received.body["site_enqueued_at"].endswith("Z")


def test_a_backlog_goes_in_batches_of_batch_size_in_order(make_outbox, central):
    outbox = make_outbox(batch_size=3)
    sent = send_many(outbox, 7)

    result = outbox.forward_once()

    paths = [received.path for received in central.requests]
    assert paths == ["/api/v1/notifications/batch/"] * 2 + ["/api/v1/notifications/"]
    assert [len(r.body["notifications"]) for r in central.requests[:2]] == [3, 3]
    assert central.posted_ids() == sent
    assert (result.forwarded, result.requests) == (7, 3)
    assert outbox.stats() == {"buffered": 0, "parked": 0}


def test_batches_are_cut_to_stay_under_centrals_body_limit(outbox, central):
    notifier = outbox.notify("Operators")
    sent = [notifier.send(f"Pump {n}", "x" * 400) for n in range(6)]
    outbox.forwarder.max_batch_bytes = 1500  # central's real limit is 1 MiB; same rule, smaller numbers

    result = outbox.forward_once()

    sizes = [len(json.dumps(received.body)) for received in central.requests]
    assert result.forwarded == 6 and central.posted_ids() == sent
    assert len(sizes) == 3 and max(sizes) < 1500


def test_replayed_notifications_are_deleted_like_created_ones(outbox, central):
    sent = send_many(outbox, 3)
    for notification_id in sent[:2]:
        central._ingest(json.loads(stored_row(outbox, notification_id).payload))  # central already has them

    result = outbox.forward_once()

    assert result.forwarded == 3
    assert outbox.stats()["buffered"] == 0


def test_a_200_replay_to_a_single_post_deletes_the_row(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    central._ingest(json.loads(stored_row(outbox, notification_id).payload))

    assert outbox.forward_once().forwarded == 1
    assert stored_row(outbox, notification_id) is None


def test_rejected_batch_items_are_parked_with_centrals_errors_and_the_rest_deleted(outbox, central):
    first, second, third = send_many(outbox, 3)

    def answer(received):
        results = []
        for item in received.body["notifications"]:
            if item["notification_id"] == second:
                results.append(
                    {
                        "notification_id": second,
                        "result": "rejected",
                        "errors": {"subject": ["Must not contain CR or LF."]},
                    }
                )
            else:
                results.append({"notification_id": item["notification_id"], "result": "created", "status": {}})
        return Reply(200, {"results": results})

    central.then(answer)
    result = outbox.forward_once()

    assert (result.forwarded, result.parked) == (2, 1)
    assert stored_row(outbox, first) is None and stored_row(outbox, third) is None
    parked = outbox.status(second)
    assert parked["status"] == "Parked"
    assert parked["last_error"] == "Rejected by central: subject: Must not contain CR or LF."


def test_a_batch_answer_without_results_deletes_nothing(outbox, central):
    send_many(outbox, 2)
    central.then(Reply(200, {"notifications": []}))

    result = outbox.forward_once()

    assert (result.forwarded, result.retrying) == (0, 2)
    assert outbox.stats()["buffered"] == 2


def test_a_batch_result_for_another_id_deletes_nothing_for_that_position(outbox, central):
    first, second = send_many(outbox, 2)
    central.then(
        Reply(
            200,
            {
                "results": [
                    {"notification_id": first, "result": "created"},
                    {"notification_id": str(uuid.uuid4()), "result": "created"},
                ]
            },
        )
    )

    result = outbox.forward_once()

    assert (result.forwarded, result.retrying) == (1, 1)
    assert stored_row(outbox, second).retry_count == 1


# --- permanent rejections --------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, expected_error",
    [
        (
            Reply(400, {"error": "invalid", "detail": "Invalid input.", "errors": {"type": ["Unknown type 'fax'."]}}),
            "Rejected by central: HTTP 400: invalid: Invalid input.: type: Unknown type 'fax'.",
        ),
        (
            Reply(422, {"error": "idempotency_conflict", "detail": "different content"}),
            "Rejected by central: HTTP 422: idempotency_conflict: different content",
        ),
        (
            Reply(413, {"error": "request_too_large", "detail": "Request body exceeds 1048576 bytes."}),
            "Too large for central: HTTP 413: request_too_large: Request body exceeds 1048576 bytes.",
        ),
    ],
)
def test_a_refused_single_post_is_parked_with_centrals_error(outbox, central, answer, expected_error):
    (notification_id,) = send_many(outbox, 1)
    central.then(answer)

    result = outbox.forward_once()

    assert result.parked == 1
    status = outbox.status(notification_id)
    assert (status["status"], status["last_error"], status["retry_count"]) == ("Parked", expected_error, 0)


@pytest.mark.parametrize("refusal", [413, 400])
def test_a_refused_batch_falls_back_to_single_posts(outbox, central, refusal):
    sent = send_many(outbox, 3)
    central.then(Reply(refusal, {"error": "request_too_large", "detail": "too big"}))

    result = outbox.forward_once()

    paths = [received.path for received in central.requests]
    assert paths == ["/api/v1/notifications/batch/"] + ["/api/v1/notifications/"] * 3
    assert central.posted_ids()[3:] == sent
    assert (result.forwarded, result.parked) == (3, 0)


def test_a_batch_central_fails_on_is_halved_until_the_poison_row_is_alone_and_the_rest_get_through(
    make_outbox, central
):
    outbox = make_outbox(batch_size=8)
    sent = send_many(outbox, 8)
    poison = sent[5]

    def fail_on_poison(received):
        items = received.body["notifications"] if received.path.endswith("/batch/") else [received.body]
        if any(item["notification_id"] == poison for item in items):
            return Reply(500, {"error": "server_error", "detail": "Internal error; it has been logged."})
        return central._like_central(received)

    central.always = fail_on_poison

    result = outbox.forward_once()

    assert sorted(central.stored) == sorted(set(sent) - {poison})
    assert (result.forwarded, result.retrying, result.parked) == (7, 1, 0)
    status = outbox.status(poison)
    assert (status["status"], status["retry_count"]) == ("Forwarding", 0)  # a 500 is never counted toward parking
    assert "HTTP 500" in status["last_error"]
    assert status["held"].startswith("central failed on this notification 1 time(s)")
    # 8 → 4 + 4 → 2 + 2 → 1 + 1: seven requests isolate one row among eight.
    assert len(central.requests) == 7


def test_a_single_post_central_fails_on_is_retried_not_split(outbox, central):
    send_many(outbox, 1)
    central.then(Reply(500, {"error": "server_error", "detail": "boom"}))

    result = outbox.forward_once()

    assert (result.retrying, result.parked, len(central.requests)) == (1, 0, 1)


# --- the credential ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_credential_stops_forwarding_loudly_and_parks_nothing(make_outbox, central, status, caplog):
    outbox = make_outbox(batch_size=2)
    sent = send_many(outbox, 5)
    central.always = Reply(status, {"error": "authentication_failed", "detail": "Invalid API key."})

    with pytest.raises(CredentialRejected) as raised:
        outbox.forward_once()

    assert raised.value.status == status
    assert len(central.requests) == 1  # stopped at the first refusal, not one per batch
    assert all(stored_row(outbox, nid).retry_count == 0 for nid in sent)
    assert outbox.stats() == {"buffered": 5, "parked": 0}
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors and "FORWARDING STOPPED" in errors[0].getMessage()


def test_run_forever_keeps_retrying_a_rejected_credential_and_resumes_when_it_is_accepted(make_outbox, central):
    outbox = make_outbox(sweep_interval=0.01, retry_interval=0.01, clock=None)
    send_many(outbox, 2)
    central.then(Reply(401), Reply(401))  # the key is fixed at central after two refusals
    stop, emptied = threading.Event(), threading.Event()

    def progress(result):
        if outbox.stats()["buffered"] == 0:
            emptied.set()

    forwarder = threading.Thread(target=outbox.run_forever, args=(stop,), kwargs={"progress": progress})
    forwarder.start()
    try:
        assert emptied.wait(10)
    finally:
        stop.set()
        forwarder.join(10)

    assert not forwarder.is_alive()
    assert len(central.requests) == 3
    assert outbox.stats() == {"buffered": 0, "parked": 0}


# --- transient failures ----------------------------------------------------------------------


def test_a_503_counts_no_retry_and_the_forwarder_waits_the_retry_interval(make_outbox, central, clock):
    outbox = make_outbox(retry_interval=30)
    (notification_id,) = send_many(outbox, 1)
    central.then(Reply(503, {"error": "database_unavailable", "detail": "The database is unavailable."}))

    result = outbox.forward_once()

    row = stored_row(outbox, notification_id)
    assert (result.retrying, result.unreachable, row.retry_count, row.status) == (1, True, 0, "forwarding")
    assert row.next_attempt_at == "2026-11-21T10:00:30.000000Z"
    assert row.last_error == "HTTP 503: database_unavailable: The database is unavailable."
    clock.advance(29)
    assert outbox.forward_once().requests == 0
    clock.advance(1)
    assert outbox.forward_once().forwarded == 1


def test_a_connection_reset_is_transient(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    central.then(Reset(), Reset())  # the fresh-connection resend is reset too

    result = outbox.forward_once()

    assert result.retrying == 1
    assert "central unreachable" in stored_row(outbox, notification_id).last_error


def test_a_timeout_is_transient(make_outbox, central):
    outbox = make_outbox(timeout=0.2)
    (notification_id,) = send_many(outbox, 1)
    central.then(Hang())

    result = outbox.forward_once()

    assert result.retrying == 1
    assert "did not answer within the timeout" in stored_row(outbox, notification_id).last_error


def test_an_unreachable_central_is_transient(make_outbox):
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    outbox = make_outbox(central_url=f"http://127.0.0.1:{port}")
    (notification_id,) = send_many(outbox, 1)

    assert outbox.forward_once().retrying == 1
    assert "ConnectionRefusedError" in stored_row(outbox, notification_id).last_error


def test_a_proxys_502_to_a_batch_counts_no_retry_on_any_row(outbox, central):
    sent = send_many(outbox, 4)
    central.then(Reply(502))

    result = outbox.forward_once()

    assert (result.retrying, result.parked) == (4, 0)
    assert [stored_row(outbox, nid).retry_count for nid in sent] == [0, 0, 0, 0]
    assert all(stored_row(outbox, nid).last_error == "HTTP 502 Bad Gateway" for nid in sent)


def test_a_429_holds_off_for_retry_after_without_counting_a_retry(outbox, central, clock):
    (notification_id,) = send_many(outbox, 1)
    central.then(Reply(429, {"error": "throttled"}, headers={"Retry-After": "120"}))

    result = outbox.forward_once()

    assert result.throttled_for == 120
    assert stored_row(outbox, notification_id).retry_count == 0
    clock.advance(119)
    assert outbox.forward_once().requests == 0
    clock.advance(1)
    assert outbox.forward_once().forwarded == 1
    assert len(central.requests) == 2


def test_a_429_with_an_http_date_is_honoured(outbox, central, clock):
    send_many(outbox, 1)
    central.then(Reply(429, headers={"Retry-After": "Sat, 21 Nov 2026 10:01:00 GMT"}))

    assert outbox.forward_once().throttled_for == 60


# --- connections -----------------------------------------------------------------------------


def test_requests_reuse_one_keep_alive_connection(make_outbox, central):
    outbox = make_outbox(batch_size=2)
    send_many(outbox, 6)

    outbox.forward_once()

    assert len(central.requests) == 3
    assert len(central.connections) == 1


def test_a_stale_keep_alive_connection_is_replaced_without_counting_a_retry(outbox, central):
    send_many(outbox, 1)
    outbox.forward_once()
    (_notification_id,) = send_many(outbox, 1)
    central.then(Reset())  # central dropped the idle connection

    result = outbox.forward_once()

    assert (result.forwarded, result.retrying) == (1, 0)
    assert len(central.connections) == 2


# --- sweeps ---------------------------------------------------------------------------------


def test_a_set_stop_event_ends_the_sweep_after_the_current_request(make_outbox, central):
    outbox = make_outbox(batch_size=2)
    send_many(outbox, 6)
    stop = threading.Event()

    result = outbox.forward_once(stop_event=stop, progress=lambda result: stop.set())

    assert (result.requests, result.forwarded) == (1, 2)
    assert outbox.stats()["buffered"] == 4


def test_site_id_is_sent_as_source_site_id(make_outbox, central):
    outbox = make_outbox(site_id="plant-a")
    send_many(outbox, 1)

    outbox.forward_once()

    assert central.requests[0].body["source_site_id"] == "plant-a"


# --- status ---------------------------------------------------------------------------------


def test_status_is_forwarding_while_the_site_holds_the_row_then_centrals_record(outbox, central):
    (notification_id,) = send_many(outbox, 1)

    local = outbox.status(notification_id)
    assert (local["status"], local["location"], local["list_name"]) == ("Forwarding", "site", "Operators")
    assert central.requests == []  # answered locally

    outbox.forward_once()
    remote = outbox.status(notification_id)

    assert remote == {
        **central.status_record(notification_id),
        "location": "central",
        "final": False,
        "acknowledgement": None,
    }
    assert central.requests[-1].path == f"/api/v1/notifications/{notification_id}/"


def test_status_of_an_id_nobody_knows_is_none(outbox, central):
    assert outbox.status(uuid.uuid4()) is None


def test_status_when_central_cannot_be_asked_says_so(outbox, central):
    central.then(Reply(503), Reply(503))
    with pytest.raises(CentralUnreachable):
        outbox.status(uuid.uuid4())


def test_status_refuses_an_id_that_is_not_a_uuid(outbox):
    with pytest.raises(ValueError):
        outbox.status("pump-3")


def test_transient_failures_are_logged_with_the_error(outbox, central, caplog):
    send_many(outbox, 1)
    central.then(Reply(503))

    with caplog.at_level(logging.WARNING, logger="sites.agent"):
        outbox.forward_once()

    assert any("next try in 30 s: HTTP 503" in record.getMessage() for record in caplog.records)


def test_a_buffered_row_nested_too_deeply_to_decode_is_parked_and_the_rest_are_forwarded(make_outbox, central):
    outbox = make_outbox(batch_size=10)
    sent = send_many(outbox, 3)
    deep_id = str(uuid.uuid4())
    payload = f'{{"notification_id": "{deep_id}", "type_data": {"[" * 100_000}{"]" * 100_000}}}'
    outbox.buffer.insert(notification_id=deep_id, payload=payload, created_at="2026-11-21T09:00:00Z")

    result = outbox.forward_once()

    assert sorted(central.stored) == sorted(sent)
    assert (result.forwarded, result.parked, result.dropped) == (3, 1, 0)
    assert "nested too deeply" in outbox.status(deep_id)["last_error"]
