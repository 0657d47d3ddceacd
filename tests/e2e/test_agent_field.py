"""End to end, as a site integrator installs the agent: the one-file zipapp run by old and new
Pythons, against the real central (gunicorn on the test database, SQLite or PostgreSQL) — plain,
over TLS from a private CA, with mutual TLS, and through a CONNECT proxy — and ``doctor`` in
each state a site meets (central down, wrong key, right key)."""

import json
import signal
import ssl
import subprocess
import sys
import urllib.request

import pytest

from notifications.models import Notification
from sites.agent import SiteOutbox
from sites.agent.contract import MAX_BODY_BYTES, MAX_LENGTHS, notification_payload
from sites.models import Site
from sites.services import site_key_issue
from tests.agent.connect_proxy import ConnectProxy
from tests.agent.pythons import find_interpreter
from tests.support.processes import ROOT, Central, child_env, poll

pytestmark = pytest.mark.slow


@pytest.fixture
def site_key(transactional_db):
    site = Site.objects.create(site_id="plant-field", name="Plant Field")
    _, key = site_key_issue(site=site)
    return key


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent-dist")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "agent_dist.py"), "--out", str(out)], check=True)
    return out / "outbox-agent.pyz"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tests.agent.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


class TlsCentral(Central):
    """Central under gunicorn serving HTTPS with a certificate from the test's private CA;
    with ``require_client_cert`` gunicorn also demands a client certificate from that CA."""

    def __init__(self, pki, *, require_client_cert=False, **options):
        arguments = f"--certfile {pki.server_cert} --keyfile {pki.server_key}"
        if require_client_cert:
            arguments += f" --ca-certs {pki.ca} --cert-reqs {int(ssl.CERT_REQUIRED)}"
        super().__init__(workers=1, GUNICORN_CMD_ARGS=arguments, **options)
        self.url = f"https://127.0.0.1:{self.port}"
        self._context = ssl.create_default_context(cafile=str(pki.ca))
        self._context.load_cert_chain(str(pki.client_cert), str(pki.client_key))

    def healthy(self):
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"gunicorn exited with {self.process.returncode}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1, context=self._context) as response:
                return response.status == 200
        except OSError:
            return False


def agent(python, pyz, *argv, env):
    """Run the zipapp with ``python``; returns the CompletedProcess."""
    return subprocess.run(
        [python, str(pyz), *argv],
        env=env,
        cwd=str(pyz.parent),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def agent_env(tmp_path, central_url, key, **extra):
    env = child_env(OUTBOX_AGENT_DB=tmp_path / "buffer.sqlite3", OUTBOX_CENTRAL_URL=central_url, OUTBOX_SITE_KEY=key)
    for name in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env.pop(name, None)  # only the zipapp provides the agent, and no proxy unless a test sets one
    env.update({name: str(value) for name, value in extra.items()})
    return env


def doctor_levels(out):
    """``{"central": "OK", …}`` from doctor's lines."""
    levels = {}
    for line in out.splitlines()[1:]:
        level, name = line.split()[:2]
        levels[name.rstrip(":")] = level
    return levels


def at_central(ids):
    return Notification.objects.filter(pk__in=ids).count() == len(ids)


@pytest.mark.parametrize("version", ["3.8", "3.13"])
def test_the_zipapp_buffers_while_central_is_down_and_forwards_when_it_is_back(version, pyz, site_key, tmp_path):
    python = find_interpreter(version)
    if python is None:
        pytest.skip(f"python{version} is not installed on this machine")
    central = Central(workers=1)
    env = agent_env(tmp_path, central.url, site_key)

    ids = []
    for n in range(3):
        sent = agent(
            python, pyz, "send", "--list", "Operators", "--subject", f"Pump {n} tripped", "--body", "x", env=env
        )
        assert sent.returncode == 0, sent.stderr
        ids.append(sent.stdout.strip())

    down = agent(python, pyz, "doctor", env=env)
    assert down.returncode == 1
    assert doctor_levels(down.stdout)["central"] == "FAIL" and "unreachable" in down.stdout
    assert f"(Python {version}." in down.stdout.splitlines()[0]

    forwarder = subprocess.Popen(
        [python, str(pyz), "forward", "--sweep-interval", "0.2", "--retry-interval", "0.2", "--max-retries", "0"],
        env=env,
        cwd=str(pyz.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert forwarder.stdout is not None
    try:
        assert forwarder.stdout.readline().startswith("forwarding ")
        assert forwarder.stdout.readline().startswith("forwarded 0, parked 0, retrying 3")  # central is down
        with central:
            wrong = agent(python, pyz, "--key", "not-the-key", "doctor", env=env)
            poll(lambda: at_central(ids), timeout=60, interval=0.1, message="the forwarder did not forward")
            right = agent(python, pyz, "doctor", env=env)
            stats = agent(python, pyz, "stats", "--json", env=env)
        forwarder.send_signal(signal.SIGTERM)
        out, err = forwarder.communicate(timeout=30)
    finally:
        forwarder.kill()

    assert wrong.returncode == 1
    assert doctor_levels(wrong.stdout) == {**doctor_levels(wrong.stdout), "central": "OK", "key": "FAIL"}
    assert "central refused the key (HTTP 401" in wrong.stdout
    assert right.returncode == 0, right.stdout
    levels = doctor_levels(right.stdout)
    assert "FAIL" not in levels.values()
    assert (levels["central"], levels["key"], levels["clock"], levels["sqlite"], levels["journal"]) == ("OK",) * 5
    assert json.loads(stats.stdout) == {"buffered": 0, "parked": 0}
    assert forwarder.returncode == 0, err
    assert out.rstrip().endswith("SIGTERM received: finished the current request; stopped")
    assert set(Notification.objects.filter(pk__in=ids).values_list("source_site_id", flat=True)) == {"plant-field"}


def test_a_central_with_a_private_ca_is_trusted_only_with_the_ca_file(pyz, site_key, pki, tmp_path):
    python = sys.executable
    with TlsCentral(pki) as central:
        env = agent_env(tmp_path, central.url, site_key)
        sent = agent(python, pyz, "send", "--list", "Operators", "--subject", "Over TLS", "--body", "b", env=env)
        notification_id = sent.stdout.strip()

        untrusted = agent(python, pyz, "doctor", env=env)
        refused = agent(python, pyz, "forward", "--once", "--retry-interval", "0", env=env)
        trusted = agent(python, pyz, "--ca-file", str(pki.ca), "doctor", env=env)
        forwarded = agent(python, pyz, "--ca-file", str(pki.ca), "forward", "--once", env=env)

    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stdout
    assert "OUTBOX_CA_FILE" in untrusted.stdout
    assert '"retrying": 1' in refused.stdout
    assert trusted.returncode == 0, trusted.stdout
    assert doctor_levels(trusted.stdout)["key"] == "OK"
    assert '"forwarded": 1' in forwarded.stdout, forwarded.stderr
    assert at_central([notification_id])


def test_mutual_tls_needs_the_client_certificate(pyz, site_key, pki, tmp_path):
    python = sys.executable
    with TlsCentral(pki, require_client_cert=True) as central:
        env = agent_env(tmp_path, central.url, site_key, OUTBOX_CA_FILE=pki.ca)
        notification_id = agent(
            python, pyz, "send", "--list", "Operators", "--subject", "mTLS", "--body", "b", env=env
        ).stdout.strip()

        without = agent(python, pyz, "doctor", env=env)
        certified = {**env, "OUTBOX_CLIENT_CERT": str(pki.client_cert), "OUTBOX_CLIENT_KEY": str(pki.client_key)}
        with_cert = agent(python, pyz, "doctor", env=certified)
        forwarded = agent(python, pyz, "forward", "--once", env=certified)

    assert without.returncode == 1 and doctor_levels(without.stdout)["central"] == "FAIL"
    assert with_cert.returncode == 0, with_cert.stdout
    assert '"forwarded": 1' in forwarded.stdout, forwarded.stderr
    assert at_central([notification_id])


def test_a_site_behind_a_proxy_reaches_tls_central_through_a_connect_tunnel(pyz, site_key, pki, tmp_path):
    python = sys.executable
    with TlsCentral(pki) as central, ConnectProxy(credentials="plant:pw") as proxy:
        proxy_url = f"http://plant:pw@127.0.0.1:{proxy.port}"
        env = agent_env(tmp_path, central.url, site_key, OUTBOX_CA_FILE=pki.ca, HTTPS_PROXY=proxy_url)
        ids = [
            agent(
                python, pyz, "send", "--list", "Operators", "--subject", f"Proxy {n}", "--body", "b", env=env
            ).stdout.strip()
            for n in range(3)
        ]
        doctor = agent(python, pyz, "doctor", env=env)
        forwarded = agent(python, pyz, "forward", "--once", env=env)

    assert doctor.returncode == 0, doctor.stdout
    assert f"via proxy http://127.0.0.1:{proxy.port}" in doctor.stdout
    assert '"forwarded": 3' in forwarded.stdout, forwarded.stderr
    assert set(proxy.connects) == {f"127.0.0.1:{central.port}"}
    assert at_central(ids)


# --- the agent's limits are central's limits --------------------------------------------------------


def agent_payload(**fields):
    values: dict = {
        "list_name": "Operators",
        "subject": "s",
        "body": "b",
        "source_instance_id": None,
        "source_script": None,
        "type": "email",
        "type_data": None,
        "site_id": None,
        "enqueued_at": "2026-11-21T10:00:00.000000Z",
    }
    values.update(fields)
    return json.loads(notification_payload(**values)[1])


@pytest.mark.parametrize("field", ["list_name", "subject", "body", "source_instance_id", "source_script"])
def test_each_text_limit_the_agent_enforces_is_exactly_centrals(api, field):
    limit = MAX_LENGTHS[field]
    at_limit = agent_payload(**{field: "x" * limit})  # the agent accepts it
    assert api.post("/api/v1/notifications/", at_limit, format="json").status_code == 201

    over = {**agent_payload(), field: "x" * (limit + 1)}  # what the agent refuses at send()
    response = api.post("/api/v1/notifications/", over, format="json")
    assert response.status_code == 400 and field in response.json()["errors"]


def test_the_type_data_limit_the_agent_enforces_is_centrals(api):
    overhead = len(json.dumps({"blob": ""}))
    at_limit = agent_payload(type_data={"blob": "x" * (65_536 - overhead)})
    assert api.post("/api/v1/notifications/", at_limit, format="json").status_code == 201

    over = {**agent_payload(), "type_data": {"blob": "x" * (65_537 - overhead)}}
    response = api.post("/api/v1/notifications/", over, format="json")
    assert response.status_code == 400 and "type_data" in response.json()["errors"]


def test_an_email_attachment_beyond_64_kib_that_the_agent_accepts_central_accepts(api):
    chart = {"filename": "trend.png", "content_type": "image/png", "content_base64": "iVBORw0K" * 20_000}
    accepted = agent_payload(type_data={"attachments": [chart]})  # the agent accepts it
    assert api.post("/api/v1/notifications/", accepted, format="json").status_code == 201


def test_the_agents_default_body_limit_is_centrals_default(settings):
    assert MAX_BODY_BYTES == settings.OUTBOX_MAX_BODY_BYTES


def test_an_agent_configured_with_centrals_smaller_limit_refuses_what_central_would_answer_413(tmp_path, settings):
    with SiteOutbox(tmp_path / "buffer.sqlite3", None, None, max_body_bytes=4096) as outbox:
        with pytest.raises(ValueError, match="at most 4,096 bytes"):
            outbox.notify("Operators").send("s", "x" * 5000)
        assert outbox.stats()["buffered"] == 0
