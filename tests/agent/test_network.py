"""The connection to central as a plant network has it: HTTPS_PROXY/HTTP_PROXY/NO_PROXY, a
private CA for central's certificate, a client certificate for mutual TLS.

Central is the scripted stand-in (tests/agent/fake_central.py) served over real TLS with
certificates from a CA made for the test, and the proxy is a real forward proxy on 127.0.0.1
(tests/agent/connect_proxy.py). The same paths against the real central under gunicorn are in
tests/e2e/test_agent_field.py.
"""

import json
import ssl

import pytest

from sites.agent import CentralUnreachable, SiteOutbox
from sites.agent.central import CentralClient, bypasses_proxy, parse_proxy
from sites.agent.cli import main
from tests.agent.conftest import send_many
from tests.agent.connect_proxy import ConnectProxy
from tests.agent.fake_central import GOOD_KEY, FakeCentral

PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_from_the_machine(monkeypatch):
    """Each test states its own proxy environment."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def server_context(pki, *, require_client_cert=False):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(pki.ca))
    return context


@pytest.fixture
def tls_central(pki):
    server = FakeCentral(tls=server_context(pki)).start()
    yield server
    server.stop()


@pytest.fixture
def mtls_central(pki):
    server = FakeCentral(tls=server_context(pki, require_client_cert=True)).start()
    yield server
    server.stop()


@pytest.fixture
def proxy():
    with ConnectProxy() as running:
        yield running


def outbox_for(buffer_path, url, **options):
    options.setdefault("timeout", 5)
    return SiteOutbox(buffer_path, url, GOOD_KEY, retry_interval=0, **options)


# --- a private CA ---------------------------------------------------------------------------------


def test_central_with_a_private_ca_is_trusted_with_the_ca_file(buffer_path, tls_central, pki):
    with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.ca)) as outbox:
        sent = send_many(outbox, 3)
        result = outbox.forward_once()

    assert result.forwarded == 3
    assert sorted(tls_central.posted_ids()) == sorted(sent)


def test_central_with_a_private_ca_is_refused_without_the_ca_file_and_the_error_says_what_to_set(
    buffer_path, tls_central
):
    with outbox_for(buffer_path, tls_central.url) as outbox:
        (notification_id,) = send_many(outbox, 1)
        result = outbox.forward_once()
        row = outbox.buffer.get(notification_id)

    assert result.retrying == 1 and tls_central.requests == []
    assert "CERTIFICATE_VERIFY_FAILED" in row.last_error and "OUTBOX_CA_FILE" in row.last_error


def test_a_ca_file_of_another_ca_is_refused(buffer_path, tls_central, pki):
    with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.other_ca)) as outbox:
        send_many(outbox, 1)
        assert outbox.forward_once().retrying == 1
    assert tls_central.requests == []


def test_an_unreadable_ca_file_is_a_configuration_error_naming_the_file(buffer_path, tmp_path):
    missing = tmp_path / "nowhere" / "ca.pem"
    with pytest.raises(ValueError, match="OUTBOX_CA_FILE") as raised:
        SiteOutbox(buffer_path, "https://central.example", GOOD_KEY, ca_file=str(missing))
    assert str(missing) in str(raised.value)


def test_tls_options_for_a_plain_http_central_are_refused(buffer_path, pki):
    with pytest.raises(ValueError, match="not https"):
        SiteOutbox(buffer_path, "http://central.example", GOOD_KEY, ca_file=str(pki.ca))


# --- mutual TLS -----------------------------------------------------------------------------------


def test_mutual_tls_presents_the_client_certificate(buffer_path, mtls_central, pki):
    options = {"ca_file": str(pki.ca), "client_cert": str(pki.client_cert), "client_key": str(pki.client_key)}
    with outbox_for(buffer_path, mtls_central.url, **options) as outbox:
        send_many(outbox, 2)
        assert outbox.forward_once().forwarded == 2


def test_mutual_tls_without_a_client_certificate_is_refused_by_central(buffer_path, mtls_central, pki):
    with outbox_for(buffer_path, mtls_central.url, ca_file=str(pki.ca)) as outbox:
        (notification_id,) = send_many(outbox, 1)
        result = outbox.forward_once()
        assert result.retrying == 1
        assert "central unreachable" in outbox.buffer.get(notification_id).last_error
    assert mtls_central.requests == []


def test_a_client_key_without_a_certificate_is_refused(buffer_path, pki):
    with pytest.raises(ValueError, match="OUTBOX_CLIENT_CERT"):
        SiteOutbox(buffer_path, "https://central.example", GOOD_KEY, client_key=str(pki.client_key))


def test_a_client_certificate_that_does_not_match_its_key_is_refused(buffer_path, pki):
    with pytest.raises(ValueError, match="client certificate"):
        SiteOutbox(
            buffer_path,
            "https://central.example",
            GOOD_KEY,
            client_cert=str(pki.client_cert),
            client_key=str(pki.server_key),
        )


# --- proxies ----------------------------------------------------------------------------------------


def test_https_central_is_reached_through_a_connect_tunnel_from_https_proxy(
    buffer_path, tls_central, pki, proxy, monkeypatch
):
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.ca)) as outbox:
        sent = send_many(outbox, 2)
        assert outbox.client.route == f"via proxy {proxy.url}"
        assert outbox.forward_once().forwarded == 2

    port = tls_central.url.rsplit(":", 1)[1]
    assert proxy.connects == [f"127.0.0.1:{port}"]  # one tunnel, kept alive
    assert sorted(tls_central.posted_ids()) == sorted(sent)


def test_http_central_is_reached_through_http_proxy_with_absolute_urls(buffer_path, central, proxy, monkeypatch):
    monkeypatch.setenv("http_proxy", proxy.url)
    with outbox_for(buffer_path, central.url) as outbox:
        (notification_id,) = send_many(outbox, 1)
        assert outbox.forward_once().forwarded == 1
        assert outbox.status(notification_id)["location"] == "central"

    assert proxy.forwarded == [
        f"POST {central.url}/api/v1/notifications/",
        f"GET {central.url}/api/v1/notifications/{notification_id}/",
    ]
    assert proxy.connects == []


def test_no_proxy_sends_central_directly(buffer_path, central, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.0/8")
    with outbox_for(buffer_path, central.url) as outbox:
        send_many(outbox, 1)
        assert outbox.client.route == "direct"
        assert outbox.forward_once().forwarded == 1
    assert proxy.forwarded == [] and proxy.connects == []


def test_proxy_credentials_are_sent_as_basic_proxy_authorization(buffer_path, tls_central, pki, monkeypatch):
    with ConnectProxy(credentials="plant a:s3cr@t") as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://plant%20a:s3cr%40t@127.0.0.1:{proxy.port}")
        with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.ca)) as outbox:
            send_many(outbox, 1)
            assert outbox.forward_once().forwarded == 1
    assert proxy.authorizations == [proxy.expected]


def test_a_proxy_that_demands_credentials_makes_forwarding_transient_with_the_proxy_named(
    buffer_path, tls_central, pki, monkeypatch
):
    with ConnectProxy(credentials="plant:secret") as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.ca)) as outbox:
            (notification_id,) = send_many(outbox, 1)
            assert outbox.forward_once().retrying == 1
            error = outbox.buffer.get(notification_id).last_error
    assert "407" in error and f"via proxy {proxy.url}" in error
    assert tls_central.requests == []


def test_an_explicit_proxy_overrides_the_environment_and_none_goes_direct(buffer_path, central, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    with outbox_for(buffer_path, central.url, proxy=proxy.url) as outbox:
        send_many(outbox, 1)
        assert outbox.forward_once().forwarded == 1
    with outbox_for(buffer_path, central.url, proxy="") as outbox:
        assert outbox.client.route == "direct"
    assert len(proxy.forwarded) == 1


def test_a_proxy_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="only http:// proxies"):
        CentralClient("https://central.example", GOOD_KEY, proxy="socks5://127.0.0.1:1080")


@pytest.mark.parametrize(
    "host, port, no_proxy, bypassed",
    [
        ("central.example.com", 443, "example.com", True),
        ("central.example.com", 443, ".example.com", True),
        ("example.com", 443, ".example.com", True),
        ("badexample.com", 443, "example.com", False),
        ("central.example.com", 443, "other.org, example.com", True),
        ("central.example.com", 443, "example.com:8443", False),
        ("central.example.com", 8443, "example.com:8443", True),
        ("10.1.2.3", 443, "10.0.0.0/8", True),
        ("10.1.2.3", 443, "192.168.0.0/16", False),
        ("127.0.0.1", 8000, "127.0.0.1", True),
        ("::1", 443, "::1", True),
        ("anything", 443, "*", True),
        ("central.example.com", 443, "", False),
    ],
)
def test_no_proxy_entries_match_hosts_domains_addresses_and_ranges(host, port, no_proxy, bypassed):
    assert bypasses_proxy(host, port, no_proxy) is bypassed


def test_a_proxy_url_without_a_scheme_or_port_defaults_to_http_port_80():
    proxy = parse_proxy("proxy.plant.local")
    assert (proxy.host, proxy.port, proxy.authorization) == ("proxy.plant.local", 80, None)


# --- the command line ------------------------------------------------------------------------------


def test_cli_flags_configure_ca_client_certificate_and_proxy(buffer_path, mtls_central, pki, proxy, capsys):
    common = ["--db", str(buffer_path), "--central-url", mtls_central.url, "--key", GOOD_KEY]
    tls = ["--ca-file", str(pki.ca), "--client-cert", str(pki.client_cert), "--client-key", str(pki.client_key)]
    assert main([*common, "send", "--list", "Operators", "--subject", "s", "--body", "b"]) == 0
    code = main([*common, *tls, "--proxy", proxy.url, "forward", "--once", "--quiet"])
    out = capsys.readouterr().out

    assert code == 0, out
    assert f"via proxy {proxy.url}" in out and json.loads(out.splitlines()[-1][len("done: ") :])["forwarded"] == 1
    assert len(proxy.connects) == 1


def test_cli_reads_the_tls_settings_from_the_environment(buffer_path, mtls_central, pki, monkeypatch, capsys):
    monkeypatch.setenv("OUTBOX_AGENT_DB", str(buffer_path))
    monkeypatch.setenv("OUTBOX_CENTRAL_URL", mtls_central.url)
    monkeypatch.setenv("OUTBOX_SITE_KEY", GOOD_KEY)
    monkeypatch.setenv("OUTBOX_CA_FILE", str(pki.ca))
    monkeypatch.setenv("OUTBOX_CLIENT_CERT", str(pki.client_cert))
    monkeypatch.setenv("OUTBOX_CLIENT_KEY", str(pki.client_key))
    main(["send", "--list", "Operators", "--subject", "s", "--body", "b"])

    assert main(["forward", "--once", "--quiet"]) == 0
    assert len(mtls_central.posted_ids()) == 1
    capsys.readouterr()


def test_cli_names_a_bad_ca_file_as_a_configuration_error(buffer_path, tmp_path, capsys):
    code = main(
        [
            "--db",
            str(buffer_path),
            "--central-url",
            "https://central.example",
            "--key",
            GOOD_KEY,
            "--ca-file",
            str(tmp_path / "missing.pem"),
            "forward",
            "--once",
        ]
    )
    assert code == 2
    assert "missing.pem" in capsys.readouterr().err


def test_status_over_tls_asks_central(buffer_path, tls_central, pki):
    with outbox_for(buffer_path, tls_central.url, ca_file=str(pki.ca)) as outbox:
        (notification_id,) = send_many(outbox, 1)
        outbox.forward_once()
        assert outbox.status(notification_id)["location"] == "central"


def test_status_when_the_tls_handshake_fails_raises_central_unreachable(buffer_path, tls_central):
    with outbox_for(buffer_path, tls_central.url) as outbox, pytest.raises(CentralUnreachable):
        outbox.status("6f1c8a52-96a4-4d7e-9a53-0b1f0e3e7a11")
