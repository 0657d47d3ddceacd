"""The styled error pages people see (DEBUG off, as in production): Outbox branding, a plain
explanation and a way back; API clients keep getting JSON."""

import pytest
from django.test import RequestFactory, override_settings
from django.urls import reverse

from notifications import views
from tests.admin.conftest import login, make_user

pytestmark = [pytest.mark.django_db]


def assert_styled(response, status, heading):
    assert response.status_code == status
    body = response.content.decode()
    assert "<title>" in body and "| Outbox</title>" in body
    assert f"Error {status}" in body
    assert heading in body
    assert "notifications/favicon.svg" in body
    assert 'href="/admin/"' in body
    assert "Django" not in body


@override_settings(DEBUG=False)
def test_404_page_is_styled_and_names_the_path(client):
    response = client.get("/no-such-page/here")
    assert_styled(response, 404, "Page not found")
    assert "<code>/no-such-page/here</code>" in response.content.decode()


@override_settings(DEBUG=False)
def test_404_inside_the_console_is_styled(client):
    login(client, make_user("adam", superuser=True))
    response = client.get("/admin/notifications/nothing-here/")
    assert_styled(response, 404, "Page not found")


@override_settings(DEBUG=False)
def test_403_page_is_styled_when_a_viewer_opens_an_administrator_page(client, viewer):
    login(client, viewer)
    response = client.get(reverse("admin:notifications_smtpconfiguration_add"))
    assert_styled(response, 403, "You are not allowed to do that")


@override_settings(DEBUG=False)
def test_500_page_is_styled_and_needs_no_context():
    response = views.server_error(RequestFactory().get("/admin/"))
    assert_styled(response, 500, "Something went wrong on our side")


@override_settings(DEBUG=False)
def test_400_page_is_styled():
    response = views.bad_request(RequestFactory().get("/admin/"), ValueError("bad host"))
    assert_styled(response, 400, "Bad request")


@override_settings(DEBUG=False)
def test_api_errors_stay_json(client):
    response = client.get("/api/v1/no-such-endpoint/")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    forbidden = views.permission_denied(RequestFactory().get("/api/v1/kpis/"), PermissionError())
    assert forbidden.status_code == 403
    assert b'"error": "forbidden"' in forbidden.content


@override_settings(DEBUG=False)
def test_csrf_failure_page_is_styled():
    from django.test import Client

    csrf_client = Client(enforce_csrf_checks=True)
    response = csrf_client.post(reverse("admin:login"), {"username": "x", "password": "y"})
    assert_styled(response, 403, "The form could not be verified")
