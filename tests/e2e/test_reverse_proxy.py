"""The production reverse proxy as documented: nginx running deploy/nginx-outbox.conf (ports,
certificate and log paths substituted) in front of central's default gunicorn configuration,
with central set up for production behind a proxy (OUTBOX_HTTPS, OUTBOX_BEHIND_PROXY): HTTPS
(TLS 1.2 and 1.3), slow clients kept away from central, login posts limited per address, an
access log without query strings. Skipped, with the reason printed, where nginx is not
installed (CI installs it from Debian's packages)."""

import http.client
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from tests.agent.certs import make_pki
from tests.support.payloads import make_payload
from tests.support.processes import ROOT, Central, free_port, poll, stop
from tests.support.slow_clients import under_slow_clients

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)"),
]


def nginx_config(directory: Path, *, upstream: int, https: int, http: int, cert: Path, key: Path) -> Path:
    """deploy/nginx-outbox.conf as it is, ports and certificate paths substituted, inside a
    minimal main configuration that keeps every file under ``directory``."""
    site = (ROOT / "deploy" / "nginx-outbox.conf").read_text()
    for old, new in (
        ("server 127.0.0.1:8000;", f"server 127.0.0.1:{upstream};"),
        ("listen 443 ssl;", f"listen 127.0.0.1:{https} ssl;"),
        ("listen 80;", f"listen 127.0.0.1:{http};"),
        ("/etc/ssl/outbox/fullchain.pem", str(cert)),
        ("/etc/ssl/outbox/privkey.pem", str(key)),
        ("/var/log/nginx/outbox.access.log", str(directory / "outbox.access.log")),
    ):
        assert old in site, f"deploy/nginx-outbox.conf no longer has {old!r}"
        site = site.replace(old, new)
    assert "/var/log/" not in site, "deploy/nginx-outbox.conf has a log path this test does not substitute"
    (directory / "outbox.conf").write_text(site)
    main = directory / "nginx.conf"
    main.write_text(
        f"pid {directory}/nginx.pid;\n"
        f"error_log {directory}/error.log warn;\n"
        "events { worker_connections 512; }\n"
        "http {\n"
        f"  access_log {directory}/access.log;\n"
        + "".join(
            f"  {name}_temp_path {directory}/{name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        + f"  include {directory}/outbox.conf;\n"
        "}\n"
    )
    return main


@pytest.fixture
def proxied_central(transactional_db, tmp_path):
    pki = make_pki(tmp_path / "pki")
    https_port, http_port = free_port(), free_port()
    with Central(
        workers=1,
        OUTBOX_HTTPS="true",
        OUTBOX_BEHIND_PROXY="true",
        SECRET_KEY="a-test-secret-key-" + "x" * 40,
        ALLOWED_HOSTS="127.0.0.1",
    ) as central:
        config = nginx_config(
            tmp_path,
            upstream=central.port,
            https=https_port,
            http=http_port,
            cert=pki.server_cert,
            key=pki.server_key,
        )
        assert NGINX is not None
        nginx = subprocess.Popen(
            [NGINX, "-p", str(tmp_path), "-c", str(config), "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            poll(lambda: _healthz(http_port) or nginx.poll() is not None, timeout=20, message="nginx did not start")
            assert nginx.poll() is None, nginx.communicate()[1]
            context = ssl.create_default_context(cafile=str(pki.ca))
            yield https_port, http_port, context
        finally:
            stop(nginx, timeout=10)


def _healthz(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def test_notifications_go_through_the_proxy_over_https_and_healthz_answers_over_http(proxied_central, site_key):
    https_port, http_port, context = proxied_central
    connection = http.client.HTTPSConnection("127.0.0.1", https_port, context=context, timeout=10)
    try:
        connection.request(
            "POST",
            "/api/v1/notifications/",
            json.dumps(make_payload()),
            {"Content-Type": "application/json", "Authorization": f"Api-Key {site_key}"},
        )
        response = connection.getresponse()
        body = json.loads(response.read())
    finally:
        connection.close()
    # Central saw HTTPS (X-Forwarded-Proto) and answered, instead of redirecting to it.
    assert response.status == 201, body
    assert body["status"] == "Pending"
    assert response.getheader("Strict-Transport-Security")
    assert _healthz(http_port)


def test_slow_clients_through_the_proxy_never_reach_central(proxied_central, site_key):
    https_port, http_port, context = proxied_central
    started = time.monotonic()
    report = under_slow_clients(
        http_port, header_clients=50, body_clients=10, key=site_key, seconds=8, dribble_port=https_port, tls=context
    )
    assert report.ratio >= 0.95, f"{report.answered} of {report.probes} probes answered within 2 s"
    assert time.monotonic() - started < 60


def _request(port, context, method, path, body=None, headers=None):
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def test_the_access_log_shows_method_and_path_but_never_a_query_string(proxied_central, tmp_path):
    https_port, _, context = proxied_central
    status, _ = _request(https_port, context, "GET", "/api/v1/notifications/?api_key=abc.supersecret&x=1")

    assert status == 401
    access_log = tmp_path / "outbox.access.log"
    line = '"GET /api/v1/notifications/ HTTP/1.1" 401'
    # nginx writes the line in its log phase, after the answer has gone out: wait for it.
    poll(lambda: line in access_log.read_text(), timeout=10, message=f"{line} never reached the access log")
    log = access_log.read_text()
    assert "supersecret" not in log and "api_key" not in log


def test_login_posts_from_one_address_beyond_a_small_burst_get_429_from_the_proxy(proxied_central):
    https_port, _, context = proxied_central
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    statuses = [
        _request(https_port, context, "POST", "/admin/login/", "username=a&password=b", form)[0] for _ in range(9)
    ]

    # 1 + a burst of 5 reach central (which refuses them: no CSRF token), the rest stop at nginx.
    assert statuses == [403] * 6 + [429] * 3
    # Loading the login page is not limited.
    assert _request(https_port, context, "GET", "/admin/login/")[0] == 200


def test_tls_1_2_clients_are_served(proxied_central):
    https_port, _, context = proxied_central
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    assert _request(https_port, context, "GET", "/healthz")[0] == 200
