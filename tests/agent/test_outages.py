"""A site never parks a notification because central could not be reached, however long the
outage: connection errors, timeouts, 5xx, 429 and proxies' error pages count nothing toward
max_retries; a refused key holds the buffer and says so; a row central answers 500 to again and
again backs off and is reported, never parked. Only central's refusal of the notification
itself (400/413/422) parks it (tests in test_forwarder.py).

Central is the scripted stand-in (tests/agent/fake_central.py) or a closed port."""

import itertools
import threading

import pytest

from sites.agent import CredentialRejected, doctor
from sites.agent.buffer import parse_utc
from sites.agent.cli import main
from tests.agent.conftest import closed_port_url, send_many
from tests.agent.fake_central import Hang, Reply, Reset

PROXY_PAGE = (
    b"<!DOCTYPE html>\r\n<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n"
)
PROXY_502 = Reply(502, raw=PROXY_PAGE, headers={"Content-Type": "text/html"})


def mixed_faults():
    """Every way central can be out of reach, one after the other."""
    faults = itertools.cycle(
        [
            Reset(),
            Reply(503, {"error": "database_unavailable", "detail": "The database is unavailable."}),
            PROXY_502,
            Reply(504, raw=b"upstream timed out", headers={"Content-Type": "text/plain"}),
            Hang(),
            Reply(429, {"error": "throttled"}, headers={"Retry-After": "1"}),
            Reply(507),
        ]
    )
    return lambda received: next(faults)


def test_an_outage_five_times_max_retries_long_parks_nothing_and_loses_nothing(make_outbox, central, clock):
    outbox = make_outbox(max_retries=3, retry_interval=30, timeout=0.2, batch_size=2)
    sent = [*send_many(outbox, 5), outbox.notify("Operators").send("Trip", "", priority="critical")]
    central.always = mixed_faults()

    for _ in range(5 * 3):
        result = outbox.forward_once()
        assert result.parked == 0
        clock.advance(30)

    assert outbox.stats() == {"buffered": 6, "parked": 0}
    assert {outbox.status(nid)["retry_count"] for nid in sent} == {0}
    central.always = None
    clock.advance(30)
    assert outbox.forward_once().forwarded == 6
    assert sorted(central.stored) == sorted(sent)


def test_a_forwarder_running_through_an_outage_of_five_times_its_retry_budget_parks_nothing(make_outbox):
    # Time compressed: a 3-attempt budget at 0.02 s spans 0.06 s; the forwarder runs through
    # at least five times that, against a port nobody listens on.
    outbox = make_outbox(
        central_url=closed_port_url(),
        max_retries=3,
        retry_interval=0.02,
        sweep_interval=0.01,
        heartbeat_interval=0,
        clock=None,
    )
    sent = send_many(outbox, 4)
    stop, attempts, enough = threading.Event(), [], threading.Event()

    def progress(result):
        attempts.append(result.requests)
        if len(attempts) >= 5 * 3:
            enough.set()

    forwarder = threading.Thread(target=outbox.run_forever, args=(stop,), kwargs={"progress": progress})
    forwarder.start()
    try:
        assert enough.wait(20)
    finally:
        stop.set()
        forwarder.join(10)

    assert outbox.stats() == {"buffered": 4, "parked": 0}
    statuses = [outbox.status(nid) for nid in sent]
    assert {status["retry_count"] for status in statuses} == {0}
    assert all(status["held"].startswith("central unreachable since ") for status in statuses)
    assert "ConnectionRefusedError" in statuses[0]["held"]


def test_an_unreachable_central_ends_the_sweep_at_the_first_failed_request(make_outbox):
    outbox = make_outbox(central_url=closed_port_url(), batch_size=2)
    send_many(outbox, 6)

    result = outbox.forward_once()

    assert (result.requests, result.retrying, result.unreachable) == (1, 2, True)


def test_a_proxys_html_error_page_becomes_one_short_line(outbox, central):
    (notification_id,) = send_many(outbox, 1)
    central.then(PROXY_502)

    outbox.forward_once()
    link = outbox.link_status()
    outbox.sync_with_central()

    expected = "HTTP 502 Bad Gateway from a proxy or web server (HTML page), not from central's API"
    assert outbox.status(notification_id)["last_error"] == expected
    assert (link["state"], link["detail"]) == ("unreachable", expected)
    assert central.heartbeats()[-1]["last_error"] == expected


# --- a refused key --------------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", [401, 403])
def test_a_refused_key_holds_the_buffer_and_status_and_doctor_say_so(make_outbox, central, clock, refusal):
    outbox = make_outbox(max_retries=1)
    sent = send_many(outbox, 3)
    central.always = Reply(refusal, {"error": "authentication_failed", "detail": "Invalid API key."})

    for _ in range(3):
        with pytest.raises(CredentialRejected):
            outbox.forward_once()
        clock.advance(60)

    assert outbox.stats() == {"buffered": 3, "parked": 0}  # held: nothing parked, nothing deleted
    status = outbox.status(sent[0])
    assert status["held"] == (
        f"central refused the site key (HTTP {refusal}: authentication_failed: Invalid API key.) since "
        "2026-11-21T10:00:00.000000Z; the buffer is held — nothing is parked or lost — until the key works "
        "(check OUTBOX_SITE_KEY and the site at central)"
    )
    checks = {check.name: check for check in doctor.doctor_run(db_path=outbox.buffer.path, client=None, clock=clock)}
    assert checks["forwarding"].level == "FAIL"
    assert checks["forwarding"].detail.startswith(
        "held since 2026-11-21T10:00:00.000000Z: central refused the site key at the last attempt"
    )
    assert outbox.link_status()["state"] == "key_refused"


def test_once_the_key_works_again_the_next_heartbeat_says_how_long_it_was_refused(make_outbox, central, clock):
    outbox = make_outbox()
    send_many(outbox, 1)
    central.then(Reply(401, {"error": "authentication_failed", "detail": "Invalid API key."}))
    with pytest.raises(CredentialRejected):
        outbox.forward_once()
    clock.advance(600)

    assert outbox.forward_once().forwarded == 1
    outbox.sync_with_central()
    outbox.sync_with_central()

    first, second = central.heartbeats()
    assert first["last_error"] == (
        "central refused the site key (HTTP 401: authentication_failed: Invalid API key.) from "
        "2026-11-21T10:00:00.000000Z until 2026-11-21T10:10:00.000000Z; the buffer was held, nothing was parked"
    )
    assert second["last_error"] == ""  # said once
    assert outbox.link_status()["state"] == "ok"


def test_a_central_too_old_for_heartbeats_does_not_keep_the_refusal_to_report_forever(make_outbox, central, clock):
    outbox = make_outbox()
    send_many(outbox, 1)
    central.then(Reply(401, {"error": "authentication_failed", "detail": "Invalid API key."}))
    with pytest.raises(CredentialRejected):
        outbox.forward_once()
    outbox.forward_once()
    central.site_always = Reply(404, {"detail": "Not found."})

    pending = outbox.state.snapshot().key_refused_episode
    outbox.sync_with_central()

    assert pending.startswith("central refused the site key")
    assert outbox.state.snapshot().key_refused_episode == ""  # the forwarder stops forcing heartbeats


def test_forward_once_on_the_command_line_exits_3_while_the_key_is_refused(central, buffer_path, capsys):
    argv = ["--db", str(buffer_path), "--central-url", central.url, "--key", "revoked-key"]
    main([*argv, "send", "--list", "Operators", "--subject", "Pump 3 tripped", "--body", "x"])

    code = main([*argv, "forward", "--once"])
    main([*argv, "stats", "--json"])

    assert code == 3
    assert capsys.readouterr().out.strip().endswith('{"buffered": 1, "parked": 0}')


# --- central failing on a row ------------------------------------------------------------------------


def test_a_row_central_answers_500_to_again_and_again_backs_off_is_reported_and_never_parks(
    make_outbox, central, clock
):
    outbox = make_outbox(max_retries=2, retry_interval=30, server_error_max_backoff=200)
    poison = outbox.notify("Operators").send("Poison", "")

    def fail_on_poison(received):
        items = received.body["notifications"] if received.path.endswith("/batch/") else [received.body or {}]
        if any(item.get("notification_id") == poison for item in items):
            return Reply(500, {"error": "server_error", "detail": "Internal error; it has been logged."})
        return central._like_central(received)

    central.always = fail_on_poison
    waits = []
    for _ in range(6):
        send_many(outbox, 1)  # the innocent rows get through meanwhile
        outbox.forward_once()
        row = outbox.buffer.get(poison)
        waits.append(round((parse_utc(row.next_attempt_at) - clock.now).total_seconds()))
        clock.advance(waits[-1])
    outbox.sync_with_central()

    assert waits == [30, 60, 120, 200, 200, 200]  # doubling, capped
    status = outbox.status(poison)
    assert (status["status"], status["retry_count"]) == ("Forwarding", 0)
    assert status["held"].startswith("central failed on this notification 6 time(s) (HTTP 500: server_error")
    assert outbox.stats() == {"buffered": 1, "parked": 0}
    assert central.heartbeats()[-1]["server_errors"] == {
        "rows": 1,
        "since": "2026-11-21T10:00:00.000000Z",
        "last_error": "HTTP 500: server_error: Internal error; it has been logged.",
    }


def test_a_row_answered_500_once_is_not_reported_yet(make_outbox, central):
    outbox = make_outbox()
    send_many(outbox, 1)
    central.then(Reply(500, {"error": "server_error", "detail": "boom"}))
    outbox.forward_once()

    outbox.sync_with_central()

    assert "server_errors" not in central.heartbeats()[-1]


def test_doctor_reports_rows_central_keeps_failing_on(make_outbox, central, clock):
    outbox = make_outbox()
    (notification_id,) = send_many(outbox, 1)
    central.always = Reply(500, {"error": "server_error", "detail": "boom"})
    for _ in range(2):
        outbox.forward_once()
        clock.advance(3600)

    checks = {check.name: check for check in doctor.doctor_run(db_path=outbox.buffer.path, client=None, clock=clock)}

    assert checks["forwarding"].level == "WARN"
    assert "1 notification(s) central answered 500 to more than once" in checks["forwarding"].detail
    assert outbox.status(notification_id)["retry_count"] == 0
