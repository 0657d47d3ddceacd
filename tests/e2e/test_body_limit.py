"""The API's body limit as a client meets it: an over-limit body gets a 413 the client can
read, over real HTTP from gunicorn, not a connection reset while it is still sending."""

import http.client
import json

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from notifications.middleware import DISCARD_FACTOR, ApiGuardMiddleware
from tests.support.processes import Central

URL = "/api/v1/notifications/"


@pytest.mark.slow
def test_a_5_mb_body_gets_a_readable_413_with_connection_close_from_gunicorn(db, site_key):
    body = b'{"subject": "' + b"x" * 5_000_000 + b'"}'
    with Central(workers=1) as central:
        connection = http.client.HTTPConnection("127.0.0.1", central.port, timeout=30)
        try:
            # The whole body is sent (no BrokenPipeError) and the answer read (no reset).
            connection.request(
                "POST",
                URL,
                body=body,
                headers={"Content-Type": "application/json", "Authorization": f"Api-Key {site_key}"},
            )
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
    assert response.status == 413
    assert response.getheader("Connection") == "close"
    assert answer == {"error": "request_too_large", "detail": "Request body exceeds 1048576 bytes."}


@pytest.mark.slow
def test_a_2_mb_chunked_body_gets_a_readable_411_from_gunicorn_not_an_empty_body(db, site_key):
    chunks = [b"x" * 65_536] * 32
    with Central(workers=1) as central:
        connection = http.client.HTTPConnection("127.0.0.1", central.port, timeout=30)
        try:
            connection.request(
                "POST",
                URL,
                body=iter(chunks),
                headers={"Content-Type": "application/json", "Authorization": f"Api-Key {site_key}"},
                encode_chunked=True,
            )
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
    assert response.status == 411
    assert answer["error"] == "length_required"


def guard(size: int) -> tuple[int, int]:
    """Pass a POST of ``size`` bytes through the guard; (status, bytes left unread)."""
    request = RequestFactory().post(URL, data=b"x" * size, content_type="application/json")

    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=201)

    response = ApiGuardMiddleware(view)(request)
    return response.status_code, len(request.read())


@override_settings(OUTBOX_MAX_BODY_BYTES=100)
def test_an_over_limit_body_is_read_and_dropped_up_to_the_bound_and_left_unread_beyond_it():
    assert guard(100) == (201, 100)  # within the limit: the view reads it
    assert guard(101) == (413, 0)
    assert guard(DISCARD_FACTOR * 100) == (413, 0)
    # Beyond the bound the server spends nothing on the body; the client may see a reset.
    assert guard(DISCARD_FACTOR * 100 + 1) == (413, DISCARD_FACTOR * 100 + 1)
