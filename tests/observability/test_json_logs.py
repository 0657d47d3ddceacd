"""LOG_FORMAT: human-readable lines by default, one JSON object per line with ``json`` (with
the notification's context where the dispatcher and ingest log), a clear error otherwise."""

import io
import json
import logging
import sys

import pytest
import requests

from outbox_project.logging_json import JsonFormatter, StderrToLog, logging_config
from tests.dispatch.conftest import configure_smtp
from tests.support.payloads import make_payload
from tests.support.processes import Central, manage, poll, settings_refusal, stop

CONTEXT = ("notification_id", "site", "channel", "worker", "outcome")


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` as JSON (fails on a line that is not one object)."""
    records = []
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            assert isinstance(record, dict), line
            records.append(record)
    return records


def test_a_record_is_one_line_with_its_context_and_its_traceback():
    logger = logging.getLogger("outbox.test")
    try:
        raise RuntimeError("line one\nline two")
    except RuntimeError:
        record = logger.makeRecord(
            "outbox.test",
            logging.ERROR,
            __file__,
            1,
            "failed %s",
            ("n-1",),
            sys.exc_info(),
            extra={"notification_id": "n-1", "site": "plant-a", "channel": "email", "attempt": 3},
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and entry["logger"] == "outbox.test" and entry["message"] == "failed n-1"
    assert entry["timestamp"].endswith("Z") and "T" in entry["timestamp"]
    assert (entry["notification_id"], entry["site"], entry["channel"], entry["attempt"]) == (
        "n-1",
        "plant-a",
        "email",
        3,
    )
    assert "worker" not in entry and "outcome" not in entry  # only where relevant
    assert "RuntimeError: line one\nline two" in entry["exception"]


def test_text_printed_to_standard_error_becomes_one_record_per_piece_up_to_a_line_break(caplog):
    real = io.StringIO()
    stderr = StderrToLog(real)
    caplog.set_level(logging.WARNING, logger="outbox.stderr")
    print("half", end="", file=stderr)
    assert caplog.records == []  # not before the line ends
    print(" and the rest", file=stderr)
    stderr.write("System check identified some issues:\n\nWARNINGS:\n?: (outbox.W002) …\n")
    stderr.write("\n")  # a blank line is no record
    stderr.write("unfinished")
    stderr.flush()
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("outbox.stderr", "WARNING", "half and the rest"),
        ("outbox.stderr", "WARNING", "System check identified some issues:\n\nWARNINGS:\n?: (outbox.W002) …"),
        ("outbox.stderr", "WARNING", "unfinished"),
    ]
    assert real.getvalue() == ""  # nothing reaches the stream but through the log handlers


def test_the_default_format_stays_human_readable():
    config = logging_config(log_format="text", level="INFO")
    assert config["formatters"]["outbox"] == {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}


@pytest.mark.parametrize("value", ["xml", "JSONL", "1"])
def test_an_unknown_log_format_stops_the_process_naming_the_variable(value):
    stderr = settings_refusal(LOG_FORMAT=value)
    assert "Environment variable LOG_FORMAT must be one of text, json" in stderr
    assert value in stderr


def test_an_unknown_log_level_stops_the_process_naming_the_variable():
    assert "Environment variable LOG_LEVEL must be" in settings_refusal(LOG_LEVEL="loud")


@pytest.mark.slow
def test_a_dispatcher_logs_json_with_the_notifications_context(transactional_db, smtp_server, operators_list):
    from tests.dispatch.conftest import queue

    configure_smtp(smtp_server)
    smtp_server.behave("4xx")
    rows = queue(2, site_id="plant-b")
    dispatcher = manage("dispatch", "--once", LOG_FORMAT="json", LOG_LEVEL="DEBUG")
    _, err = dispatcher.communicate(timeout=60)
    assert dispatcher.returncode == 0, err
    records = json_lines(err)  # every line of the log is a JSON object
    finished = [r for r in records if r["logger"] == "notifications.dispatch" and r.get("outcome") == "retrying"]
    assert sorted(r["notification_id"] for r in finished) == sorted(str(row.pk) for row in rows)
    for record in finished:
        assert {key: record[key] for key in ("site", "channel")} == {"site": "plant-b", "channel": "email"}
        assert record["worker"].startswith("dispatch:")
        assert record["level"] == "INFO" and record["failure_class"]
        assert record["notification_id"] in record["message"]


@pytest.mark.slow
def test_the_web_server_logs_json_lines_and_ingest_conflicts_carry_context(transactional_db, site_key, tmp_path):
    log_path = tmp_path / "web.log"
    payload = make_payload()
    with (
        log_path.open("w") as log,
        Central(workers=1, options=["--log-level", "info"], stderr=log, LOG_FORMAT="json", LOG_LEVEL="INFO") as central,
    ):
        headers = {"Authorization": f"Api-Key {site_key}"}
        url = f"{central.url}/api/v1/notifications/"
        assert requests.post(url, json=payload, headers=headers, timeout=10).status_code == 201
        conflicting = {**payload, "subject": "Something else"}
        assert requests.post(url, json=conflicting, headers=headers, timeout=10).status_code == 422
    records = json_lines(log_path.read_text())
    assert any(r["logger"].startswith("gunicorn") for r in records), records  # gunicorn's own lines too
    (conflict,) = [r for r in records if r["logger"] == "notifications.ingest"]
    assert {key: conflict.get(key) for key in CONTEXT if key != "worker"} == {
        "notification_id": payload["notification_id"],
        "site": "plant-a",
        "channel": "email",
        "outcome": "conflict",
    }


def every_line_json(*paths) -> list[dict]:
    """Every line of the files ``paths`` (a process's standard output and error) as a JSON
    object; fails naming the first line that is not one."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                pytest.fail(f"{path.name}: not a JSON line: {line!r}")
            assert isinstance(record, dict), line
            records.append(record)
    return records


@pytest.mark.slow
def test_every_line_the_web_server_writes_is_one_json_object(transactional_db, site_key, tmp_path):
    static_root = tmp_path / "static"
    collect = manage("collectstatic", "--noinput", "--verbosity", "0", STATIC_ROOT=static_root)
    _, err = collect.communicate(timeout=120)
    assert collect.returncode == 0, err
    out_path, err_path = tmp_path / "web.out", tmp_path / "web.err"
    with (
        out_path.open("w") as out,
        err_path.open("w") as log,
        Central(
            workers=1,
            options=["--log-level", "info"],
            stdout=out,
            stderr=log,
            LOG_FORMAT="json",
            LOG_LEVEL="INFO",
            STATIC_ROOT=static_root,
            ALLOWED_HOSTS="outbox.example.com",
        ) as central,
    ):
        own = {"Host": "outbox.example.com"}
        # A console static file (WhiteNoise under ASGI: Django warns about its synchronous file
        # iterator), the probes with the backend address as Host, a Host not served here, an
        # unknown page, and an API request.
        assert requests.get(f"{central.url}/static/admin/css/base.css", headers=own, timeout=10).status_code == 200
        assert requests.get(f"{central.url}/healthz", timeout=10).status_code == 200
        assert requests.get(f"{central.url}/metrics", timeout=10).status_code == 200
        assert requests.get(f"{central.url}/admin/", headers={"Host": "evil.example"}, timeout=10).status_code == 400
        assert requests.get(f"{central.url}/nowhere", headers=own, timeout=10).status_code == 404
        auth = {**own, "Authorization": f"Api-Key {site_key}"}
        assert (
            requests.post(f"{central.url}/api/v1/notifications/", json=make_payload(), headers=auth).status_code == 201
        )
    records = every_line_json(out_path, err_path)
    loggers = {record["logger"] for record in records}
    assert {"gunicorn.error", "django.security.DisallowedHost", "django.request"} <= loggers, loggers
    # Python's warnings are log records too: the one Django gives for WhiteNoise's file iterator.
    assert any(r["logger"] == "py.warnings" and "StreamingHttpResponse" in r["message"] for r in records), loggers


@pytest.mark.slow
def test_every_line_qcluster_writes_is_one_json_object_its_system_checks_included(transactional_db, tmp_path):
    out_path, err_path = tmp_path / "worker.out", tmp_path / "worker.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        # An attachment limit beyond the body limit: a system check warning (outbox.W002), which
        # Django prints to standard error before the command runs.
        worker = manage(
            "qcluster",
            stdout=out,
            stderr=err,
            LOG_FORMAT="json",
            LOG_LEVEL="INFO",
            OUTBOX_MAX_ATTACHMENT_BYTES=5_000_000,
        )
        try:
            poll(lambda: " running." in err_path.read_text(), timeout=60, message="qcluster did not start")
        finally:
            stop(worker, timeout=60)
    records = every_line_json(out_path, err_path)
    (check,) = [r for r in records if "outbox.W002" in r["message"]]
    assert (check["logger"], check["level"]) == ("outbox.stderr", "WARNING")
    assert "System check identified some issues" in check["message"]
    assert any(r["logger"] == "django-q" and r["message"].endswith("has stopped.") for r in records)
