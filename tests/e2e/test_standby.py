"""The standby drill, end to end: the primary buffers with central down while Litestream
replicates its buffer to a local replica directory; the primary is SIGKILLed (the sender, the
forwarder and Litestream) and its directory deleted; ``restore`` rebuilds the buffer in a second
directory, a new forwarder starts from it, and every notification acknowledged by ``send()``
more than the documented RPO before the death reaches central exactly once."""

import subprocess
import sys

import pytest

from notifications.models import EmailRecipient, Notification, NotificationList
from sites.agent import SiteOutbox
from sites.agent.standby import RPO_SECONDS, StandbyError, find_litestream
from sites.models import Site
from sites.services import site_key_issue
from tests.dispatch.conftest import configure_smtp
from tests.support.processes import ROOT, Central, child_env, manage, poll, stop
from tests.support.smtp import SmtpServer
from tests.support.standby import PrimarySite, measured_rpo, restore

pytestmark = pytest.mark.slow


@pytest.fixture
def litestream():
    try:
        return find_litestream()
    except StandbyError as error:
        pytest.skip(str(error))


def test_a_standby_restored_from_the_replica_forwards_what_the_dead_primary_acknowledged(
    transactional_db, postgres_only, settings, tmp_path, litestream
):
    settings.OUTBOX_DISPATCH_TRIGGER = False
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op1@example.com")
    _, key = site_key_issue(site=Site.objects.create(site_id="plant-standby", name="Plant Standby"))
    central = Central()  # down while the primary runs
    replica = tmp_path / "replica"
    primary = PrimarySite(tmp_path / "primary", replica, central_url=central.url, key=key).start()
    poll(lambda: len(primary.acknowledged()) >= 200, timeout=90, message="the primary did not send")
    died = primary.die()
    acks = primary.acknowledged()
    assert not (tmp_path / "primary").exists()

    standby_db = tmp_path / "standby" / "buffer.sqlite3"
    print(restore(standby_db, replica))
    with SiteOutbox(standby_db, None, None) as standby:
        restored = {row.notification_id for row in standby.buffer.due(now="9999", limit=100_000)}
    rpo = measured_rpo(acks, died=died, kept=restored)
    print(f"standby drill: {len(acks)} acknowledged, {len(restored)} restored, measured RPO {rpo} s")

    with SmtpServer(keep_content=False) as smtp, central:
        configure_smtp(smtp, timeout_seconds=5, max_retries=10, retry_interval_seconds=1)
        dispatcher = manage("dispatch", OUTBOX_DISPATCH_INTERVAL=0.2)
        env = child_env(OUTBOX_AGENT_DB=standby_db, OUTBOX_CENTRAL_URL=central.url, OUTBOX_SITE_KEY=key)
        # The standby runs the forwarder service, as an operator starts it after the restore: a
        # request that fails on a loaded machine is retried a second later, as in production.
        log = tmp_path / "standby-forward.log"
        with log.open("w") as output:
            forwarder = subprocess.Popen(
                [sys.executable, "-m", "sites.agent", "forward", "--sweep-interval", "1", "--retry-interval", "1"],
                env=env,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        required = [nid for nid, moment in acks if moment <= died - RPO_SECONDS]
        acked = [nid for nid, _ in acks]

        def at_central() -> set[str]:
            return set(map(str, Notification.objects.filter(pk__in=acked).values_list("pk", flat=True)))

        def standby_empty() -> bool:
            with SiteOutbox(standby_db, None, None) as standby:
                return standby.stats()["buffered"] == 0

        try:
            poll(
                lambda: set(required) <= at_central() and standby_empty(),
                timeout=90,
                interval=0.5,
                message=f"the standby did not forward everything; measured RPO {rpo} s",
            )
            forwarded = at_central()
            assert forwarded <= set(acked)
            poll(
                lambda: (
                    Notification.objects.filter(pk__in=list(forwarded), status="Delivered").count() == len(forwarded)
                ),
                timeout=90,
                message="not every restored notification was delivered",
            )
        finally:
            stop(forwarder)
            stop(dispatcher)
            print(log.read_text())  # the standby forwarder's output, shown when the test fails
        assert smtp.count_by_notification_id() == dict.fromkeys(forwarded, 1)
    assert rpo <= RPO_SECONDS
    assert len(required) >= 100
