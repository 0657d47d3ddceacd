"""Logs never carry a URL's query values or credentials, in either LOG_FORMAT: httpx's request
lines (a Teams Workflows URL is signed in its query), Django's 404 and 500 records (with the
request, whose text holds the full path), tracebacks, and any other logger."""

import io
import json
import logging
import logging.config

import httpx
import pytest
from django.conf import settings as django_settings

from outbox_project.log_redaction import query_redact, urls_redact
from outbox_project.logging_json import logging_config
from tests.support.receivers import Receiver

SECRETS = ("SIGVALUE123", "KEYVALUE456", "hunter2", "tokenvalue789")


@pytest.fixture(params=["text", "json"])
def log_output(request):
    """The application's logging as settings configure it for LOG_FORMAT text or json, written
    to a buffer: a function returning what was logged so far."""
    logging.config.dictConfig(logging_config(log_format=request.param, level="INFO"))
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    handler.setStream(buffer)
    yield buffer.getvalue
    logging.config.dictConfig(django_settings.LOGGING)


def assert_no_secret(text):
    for secret in SECRETS:
        assert secret not in text, f"{secret} logged"


def test_httpx_request_lines_show_the_url_without_its_query_values_or_credentials(log_output):
    with Receiver() as receiver:
        url = receiver.url("/workflows/abc/invoke") + "?api-version=2016-06-01&sp=%2Ftriggers&sig=SIGVALUE123"
        assert httpx.post(url, json={}).status_code == 200
        credentials = f"http://alarm:hunter2@127.0.0.1:{receiver.port}/hook?token=tokenvalue789"
        assert httpx.post(credentials, json={}).status_code == 200
    text = log_output()
    assert "HTTP Request: POST" in text and "/workflows/abc/invoke?api-version=[redacted]" in text
    assert "sig=[redacted]" in text and "[redacted]@127.0.0.1" in text
    assert_no_secret(text)


def test_a_404_with_an_api_key_in_the_query_is_logged_without_it(log_output, client, db):
    assert client.get("/api/v1/no-such-endpoint/?api_key=KEYVALUE456").status_code == 404
    text = log_output()
    assert "Not Found: /api/v1/no-such-endpoint/" in text
    assert_no_secret(text)
    if text.lstrip().startswith("{"):
        (record,) = [json.loads(line) for line in text.splitlines() if "Not Found" in line]
        # Django passes the request along: its text keeps the path, not the key.
        assert record["request"] == "<WSGIRequest: GET '/api/v1/no-such-endpoint/?api_key=[redacted]'>"
        assert record["status_code"] == 404


def test_a_traceback_and_any_logger_are_redacted_too(log_output):
    logger = logging.getLogger("outbox.anything")
    try:
        raise RuntimeError("could not post to https://example.com/x?sig=SIGVALUE123")
    except RuntimeError:
        logger.exception("failed for %s", "https://user:hunter2@example.com/?token=tokenvalue789")
    text = log_output()
    assert "RuntimeError: could not post to https://example.com/x?sig=[redacted]" in text.replace("\\n", "\n")
    assert "failed for https://[redacted]@example.com/?token=[redacted]" in text
    assert_no_secret(text)


def test_a_log_call_whose_arguments_do_not_fit_its_format_is_written_redacted_and_raises_nothing(log_output):
    logging.getLogger("outbox.anything").warning("posted %s to %s", "https://example.com/?sig=SIGVALUE123")
    text = log_output()
    assert "posted %s to %s" in text and "sig=[redacted]" in text
    assert_no_secret(text)


def test_query_values_are_redacted_and_everything_else_is_kept():
    assert query_redact("a=1&b=&c&d=x=y") == "a=[redacted]&b=[redacted]&[redacted]&d=[redacted]"
    assert urls_redact("GET /api/v1/notifications/?status=Parked HTTP/1.1") == (
        "GET /api/v1/notifications/?status=[redacted] HTTP/1.1"
    )
    assert urls_redact("Why? Because (see /docs/api.md).") == "Why? Because (see /docs/api.md)."
    assert urls_redact("mailto:ops@example.com and ops@example.com") == "mailto:ops@example.com and ops@example.com"
    assert urls_redact("json://u:p@host/path and smtp://relay:25") == "json://[redacted]@host/path and smtp://relay:25"


@pytest.mark.slow
def test_the_web_servers_access_and_application_logs_show_no_query_value(transactional_db, tmp_path):
    import requests

    from tests.support.processes import Central

    access_log, error_log = tmp_path / "access.log", tmp_path / "error.log"
    with (
        error_log.open("w") as errors,
        Central(workers=1, options=["--access-logfile", str(access_log), "--log-level", "info"], stderr=errors) as web,
    ):
        query = "?status=Parked&sig=SIGVALUE123&api_key=KEYVALUE456"
        assert requests.get(f"{web.url}/api/v1/notifications/{query}", timeout=10).status_code == 401
        assert requests.get(f"{web.url}/api/v1/nowhere/?token=tokenvalue789", timeout=10).status_code == 404
    access, application = access_log.read_text(), error_log.read_text()
    assert "GET /api/v1/notifications/?status=[redacted]&sig=[redacted]&api_key=[redacted] HTTP/1.1" in access
    assert "Not Found: /api/v1/nowhere/" in application
    assert_no_secret(access + application)
