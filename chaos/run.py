"""Fault-injection suite: real gunicorn, real dispatcher processes, real PostgreSQL, a real SMTP
server on loopback, and faults injected while notifications flow.

After each scenario the harness re-sends every indeterminate id until central acknowledges it,
lets the dispatchers drain, and reports:

- lost:        acknowledged, but not in the table, or not ending as expected (Delivered; Parked
               or Discarded where the scenario makes delivery impossible), or Delivered
               in the table but never received by the SMTP server;
- unexpected:  received by the SMTP server but never acknowledged to a client;
- duplicates:  messages received minus distinct ids received;
- non-terminal left: rows still Pending or Retrying after the drain;
- parked vs expected.

Required: lost = unexpected = non-terminal = 0 everywhere; duplicates = 0 except where a
dispatcher is killed, bounded there by the messages in flight at each kill.

Usage: python chaos/run.py [--short] [--only NAME[,NAME…]] [--list]
Needs PostgreSQL (CHAOS_DATABASE_URL or BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/outbox_chaos) and root for the PostgreSQL restart scenario.
Every load is bounded in count and time and targets loopback only.
"""

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import fresh_database  # noqa: E402

os.environ.setdefault("BENCH_DATABASE_URL", os.environ.get("CHAOS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/outbox"))
DATABASE_URL = fresh_database("chaos")
os.environ["DATABASE_URL"] = DATABASE_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outbox_project.settings")
os.environ.setdefault("LOG_LEVEL", "ERROR")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import close_old_connections, connection  # noqa: E402

from chaos.load import Ledger, LoadGenerator, notification, post_same_ids_concurrently, resend_until_acked  # noqa: E402
from chaos.proxy import TcpProxy  # noqa: E402
from notifications.models import EmailRecipient, Notification, NotificationList, SmtpConfiguration  # noqa: E402
from notifications.operations import notification_discard, notification_retry  # noqa: E402
from sites.agent import SiteOutbox  # noqa: E402
from sites.models import Site  # noqa: E402
from sites.services import site_key_issue  # noqa: E402
from tests.support.processes import Central, child_env, manage, poll, stop  # noqa: E402
from tests.support.smtp import SmtpServer  # noqa: E402

Status = Notification.Status
DISPATCH_ENV = {
    "OUTBOX_DISPATCH_INTERVAL": 0.2,
    "OUTBOX_LEASE_SECONDS": 5,
    "OUTBOX_BATCH_SIZE": 50,
    "OUTBOX_CONCURRENCY": 4,
}
WEB_ENV = {"OUTBOX_SITE_RATE_LIMIT": 1_000_000, "OUTBOX_DISPATCH_TRIGGER": "false"}
DOOMED = "doomed@chaos.invalid"  # the SMTP server refuses this recipient with 550


class World:
    """Everything a scenario needs; scenarios start and stop the pieces they fault."""

    def __init__(self, short):
        self.short = short
        self.smtp = SmtpServer(keep_content=False).start()
        self.smtp.behave("refuse", refuse={DOOMED})
        SmtpConfiguration.objects.update_or_create(pk=SmtpConfiguration.SINGLETON_PK, defaults=dict(
            host="127.0.0.1", port=self.smtp.port, security="none", from_address="outbox@chaos.invalid",
            timeout_seconds=2, max_retries=100, retry_interval_seconds=1))  # fmt: skip
        operators = NotificationList.objects.create(name="Operators")
        EmailRecipient.objects.create(notification_list=operators, email="op1@chaos.invalid")
        EmailRecipient.objects.create(notification_list=operators, email="op2@chaos.invalid")
        doomed = NotificationList.objects.create(name="Doomed")
        EmailRecipient.objects.create(notification_list=doomed, email=DOOMED)
        site = Site.objects.create(site_id="chaos-site", name="Chaos")
        self.key = site_key_issue(site=site)[1]
        self.operator = get_user_model().objects.create_user("chaos-operator", is_staff=True)
        self.web = Central(workers=2, **WEB_ENV).start()
        self.dispatchers = []

    @property
    def url(self):
        return self.web.url

    def start_dispatchers(self, count=2, **env):
        for _ in range(count):
            self.dispatchers.append(manage("dispatch", **{**DISPATCH_ENV, **env}))

    def stop_dispatchers(self, sig=signal.SIGTERM):
        for process in self.dispatchers:
            stop(process, sig=sig)
        self.dispatchers = []

    def close(self):
        self.stop_dispatchers()
        self.web.stop()
        self.smtp.stop()


# --- evaluation -----------------------------------------------------------------------------


def drain(ids, timeout=180):
    """Wait until none of ``ids`` is Pending or Retrying."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        close_old_connections()
        try:
            if not Notification.objects.filter(pk__in=ids, status__in=Notification.NON_TERMINAL).exists():
                return True
        except Exception:  # the database may be restarting
            connection.close()
        time.sleep(0.25)
    return False


def evaluate(name, world, *, acked, expected_parked=(), dup_bound=0, rejected=0, note="", started):
    acked = set(acked)
    expected_parked = set(expected_parked)
    close_old_connections()
    drained = drain(list(acked))
    rows = dict(Notification.objects.filter(pk__in=list(acked)).values_list("pk", "status"))
    rows = {str(pk): status for pk, status in rows.items()}
    received = Counter({nid: n for nid, n in world.smtp.count_by_notification_id().items() if nid})
    lost = []
    for nid in acked:
        status = rows.get(nid)
        if status is None:
            lost.append(nid)
        elif nid in expected_parked:
            if status not in (Status.PARKED, Status.DISCARDED):
                lost.append(nid)
        elif status != Status.DELIVERED or received[nid] == 0:
            lost.append(nid)
    unexpected = [nid for nid in received if nid not in acked]
    duplicates = sum(received.values()) - len(received)
    non_terminal = sum(1 for status in rows.values() if status in Notification.NON_TERMINAL)
    parked = sum(1 for nid, status in rows.items() if status in (Status.PARKED, Status.DISCARDED))
    ok = (not lost and not unexpected and non_terminal == 0 and duplicates <= dup_bound and drained
          and parked == len(expected_parked))  # fmt: skip
    return {
        "scenario": name, "acked": len(acked), "rejected": rejected, "lost": len(lost),
        "unexpected": len(unexpected), "duplicates": duplicates, "dup_bound": dup_bound,
        "non_terminal": non_terminal, "parked": parked, "expected_parked": len(expected_parked),
        "seconds": round(time.monotonic() - started, 1), "ok": ok, "note": note,
        "lost_ids": lost[:5],
    }  # fmt: skip


def run_load(world, *, seconds, rate=80, limit=None, make=notification, during=None):
    """Post new notifications for ``seconds`` while ``during(stop_event)`` injects faults;
    then re-send indeterminate ids until acknowledged. Returns the ledger."""
    ledger = Ledger()
    load = LoadGenerator(world.url, world.key, ledger, rate=rate, duration=seconds,
                         limit=limit or int(rate * seconds), make=make).start()  # fmt: skip
    if during:
        during()
    load.join()
    left = resend_until_acked(world.url, world.key, ledger, deadline_seconds=120)
    if left:
        print(f"  warning: {len(left)} ids never acknowledged", flush=True)
    return ledger


# --- scenarios ------------------------------------------------------------------------------


def scenario_same_ids(world):
    """Eight clients post the same ids at the same moment."""
    started = time.monotonic()
    world.start_dispatchers(2)
    ledger = Ledger()
    post_same_ids_concurrently(world.url, world.key, ledger, count=100 if world.short else 300, threads=8)
    resend_until_acked(world.url, world.key, ledger)
    result = evaluate("concurrent identical posts", world, acked=ledger.ids("ack"), started=started,
                      rejected=len(ledger.ids("reject")))  # fmt: skip
    world.stop_dispatchers()
    return result


def _children(pid):
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def scenario_web_kill(world):
    """SIGKILL a gunicorn worker three times under load (the master starts a new one)."""
    kills = []

    def kill_workers():
        for _ in range(3):
            time.sleep(1.5)
            workers = _children(world.web.process.pid)
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                kills.append(workers[0])

    result = _under_load(world, "SIGKILL web worker x3", kill_workers, seconds=6 if world.short else 10,
                         note=lambda: f"killed {len(kills)} workers; indeterminate answers re-sent")  # fmt: skip
    poll(world.web.healthy, timeout=30, message="gunicorn did not recover")
    return result


def _postgres_restart():
    clusters = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not clusters or not shutil.which("pg_ctlcluster"):
        return "no local pg_ctlcluster"
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", clusters[-1], "main", "restart", "-m", "immediate"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return None


def scenario_postgres_restart(world):
    """PostgreSQL restarted in immediate mode (a crash) three times under load."""
    if os.geteuid() != 0:
        return {"scenario": "PostgreSQL restart (immediate)", "skipped": "needs root to restart the local cluster"}
    restarts = []

    def restart():
        for _ in range(1 if world.short else 3):
            time.sleep(2)
            restarts.append(_postgres_restart() or "restarted")

    count = 1 if world.short else 3
    return _under_load(world, f"PostgreSQL restart (immediate) x{count}", restart, seconds=6 if world.short else 12,
                       note=lambda: ", ".join(restarts))  # fmt: skip


def scenario_dispatcher_kill(world):
    """SIGKILL a dispatcher mid-batch ten times; each kill may re-send what it had in flight."""
    started = time.monotonic()
    count = 600 if world.short else 2000
    ledger = run_load(world, seconds=count / 400, rate=400, limit=count)
    ids = ledger.ids("ack")
    world.smtp.behave("refuse", refuse={DOOMED}, delay_seconds=0.01)
    in_flight = set()  # accepted by the SMTP server while the row was not yet recorded Delivered
    kills = 3 if world.short else 10
    for _ in range(kills):
        victim = manage("dispatch", **DISPATCH_ENV)
        before = sum(world.smtp.count_by_notification_id().values())
        poll(lambda: sum(world.smtp.count_by_notification_id().values()) >= before + 20 or victim.poll() is not None,
             timeout=30, message="the dispatcher delivered nothing")  # fmt: skip
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        received = set(world.smtp.count_by_notification_id())
        close_old_connections()
        recorded = {str(pk) for pk in Notification.objects.filter(pk__in=ids, status=Status.DELIVERED)
                    .values_list("pk", flat=True)}  # fmt: skip
        in_flight |= received - recorded
    world.smtp.behave("refuse", refuse={DOOMED})
    world.start_dispatchers(2)
    result = evaluate(f"SIGKILL dispatcher x{kills}", world, acked=ids, dup_bound=len(in_flight), started=started,
                      note="bound = messages the SMTP server had accepted but the killed dispatcher had not "
                           "recorded, at each kill")  # fmt: skip
    duplicated = {nid for nid, n in world.smtp.count_by_notification_id().items() if n > 1}
    if not duplicated <= in_flight:
        result["ok"] = False
        result["note"] += f"; {len(duplicated - in_flight)} duplicates were NOT in flight at a kill"
    world.stop_dispatchers()
    return result


def _under_load(world, title, fault, *, seconds=6, note=lambda: ""):
    """Two dispatchers run while new notifications are posted and ``fault()`` is injected."""
    started = time.monotonic()
    world.start_dispatchers(2)
    ledger = run_load(world, seconds=seconds, during=fault)
    connection.close()  # the fault may have broken this process's connection too
    result = evaluate(title, world, acked=ledger.ids("ack"), started=started, note=note())
    world.stop_dispatchers()
    return result


def scenario_smtp_down(world):
    """The SMTP server is down for a while, then back."""

    def outage():
        time.sleep(1)
        world.smtp.stop()
        time.sleep(3)
        world.smtp.start()

    return _under_load(world, "SMTP down, then back", outage)


def scenario_smtp_hang(world):
    """The SMTP server hangs past the client timeout (2 s), then recovers."""

    def hang():
        time.sleep(1)
        world.smtp.behave("hang", hang_seconds=5, refuse={DOOMED})
        time.sleep(4)
        world.smtp.behave("refuse", refuse={DOOMED})

    return _under_load(world, "SMTP hangs past timeout", hang)


def scenario_smtp_transient_codes(world):
    """421/450/451/452 at DATA for a while (transient: retried), then accepted."""

    def codes():
        for reply in ("421 4.3.2 shutting down", "450 4.2.0 mailbox busy", "451 4.3.0 local error",
                      "452 4.3.1 insufficient storage"):  # fmt: skip
            world.smtp.code_4xx = reply
            world.smtp.behave("4xx")
            time.sleep(1.2)
        world.smtp.behave("refuse", refuse={DOOMED})

    return _under_load(world, "SMTP 421/450/451/452, then OK", codes)


def scenario_smtp_permanent_codes(world):
    """550 (refused recipient), 552 and 554 at DATA: parked, never retried; mixed with refusal of
    some recipients (delivered to the others)."""
    started = time.monotonic()
    acked, expected_parked = [], []
    for reply in ("552 5.3.4 message too big", "554 5.7.1 rejected"):
        ledger = run_load(world, seconds=1, rate=60)
        ids = ledger.ids("ack")
        world.smtp.code_5xx = reply
        world.smtp.behave("5xx")
        world.start_dispatchers(1)
        drain(ids, timeout=60)
        world.stop_dispatchers()
        world.smtp.behave("refuse", refuse={DOOMED})
        acked += ids
        expected_parked += ids
    # 550 for one recipient of a two-recipient list: delivered to the other; a list whose only
    # recipient is refused: parked.
    world.smtp.behave("refuse", refuse={DOOMED, "op2@chaos.invalid"})
    mixed = run_load(world, seconds=2, rate=60,
                     make=lambda nid: notification(nid, list_name="Doomed" if int(nid[0], 16) % 2 else "Operators"))
    world.start_dispatchers(2)
    doomed = [nid for nid in mixed.ids("ack") if int(nid[0], 16) % 2]
    acked += mixed.ids("ack")
    expected_parked += doomed
    result = evaluate("SMTP 550/552/554 + partial refusal", world, acked=acked, expected_parked=expected_parked,
                      started=started)  # fmt: skip
    world.stop_dispatchers()
    world.smtp.behave("refuse", refuse={DOOMED})
    return result


def _skewed(seconds, *args, **env):
    """A process whose application clock is ``seconds`` off (chaos/skewed.py)."""
    return subprocess.Popen([sys.executable, str(ROOT / "chaos" / "skewed.py"), str(seconds), *args],
                            env=child_env(**env), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def scenario_clock_skew(world):
    """Dispatchers whose clocks are 1 h ahead, right and 1 h behind the database, and a web process
    1 h ahead: leases and due times use the database clock, so nothing is stolen or stranded."""
    started = time.monotonic()
    dispatchers = [_skewed(skew, "manage.py", "dispatch", **DISPATCH_ENV) for skew in (3600, 0, -3600)]
    web = Central(workers=1, launcher=[ROOT / "chaos" / "skewed.py", 3600], **WEB_ENV)
    try:
        web.start()
        ledger = Ledger()
        LoadGenerator(web.url, world.key, ledger, rate=60, duration=5, limit=300).start().join()
        resend_until_acked(web.url, world.key, ledger)
        return evaluate("app clock skewed +/-1 h", world, acked=ledger.ids("ack"), started=started,
                        note="web +1 h; dispatchers +1 h, on time and -1 h")  # fmt: skip
    finally:
        web.stop()
        for process in dispatchers:
            stop(process)


def scenario_operator_race(world):
    """Operators retry and discard parked rows while dispatchers run."""
    started = time.monotonic()
    # First: parked by a 554 …
    ledger = run_load(world, seconds=2, rate=100)
    ids = ledger.ids("ack")
    world.smtp.code_5xx = "554 5.7.1 rejected"
    world.smtp.behave("5xx")
    world.start_dispatchers(2)
    drain(ids, timeout=60)
    world.smtp.behave("refuse", refuse={DOOMED})
    retry_ids, discard_ids = ids[::2], ids[1::2]
    stop_event = threading.Event()

    def operator(action, targets):
        close_old_connections()
        while not stop_event.is_set():
            action(notification_ids=targets, user=world.operator)
            time.sleep(0.05)
        connection.close()

    threads = [threading.Thread(target=operator, args=(notification_retry, retry_ids)),
               threading.Thread(target=operator, args=(notification_discard, discard_ids)),
               threading.Thread(target=operator, args=(notification_retry, discard_ids))]  # fmt: skip
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop_event.set()
    for thread in threads:
        thread.join()
    # A discard that lost every race leaves rows parked, and retried ones get delivered: both
    # are what operators asked for. What must hold: terminal states only, no duplicates.
    close_old_connections()
    drain(ids, timeout=60)
    statuses = dict(Notification.objects.filter(pk__in=ids).values_list("pk", "status"))
    not_delivered = [str(pk) for pk, status in statuses.items() if status != Status.DELIVERED]
    result = evaluate("operator Retry/Discard vs dispatcher", world, acked=ids, expected_parked=not_delivered,
                      started=started,
                      note=f"{len(not_delivered)} discarded/parked, {len(ids) - len(not_delivered)} delivered")  # fmt: skip
    # The 554 phase delivered nothing, so every delivery happened after an operator Retry.
    world.stop_dispatchers()
    return result


def scenario_agent_link(world, tmp_dir):
    """The site agent's link to central is cut and restored while it forwards."""
    started = time.monotonic()
    world.start_dispatchers(2)
    proxy = TcpProxy(world.web.port)
    outbox = SiteOutbox(Path(tmp_dir) / "agent.sqlite3", proxy.url, world.key, retry_interval=0.2, batch_size=50,
                        timeout=2)  # fmt: skip
    stop_event = threading.Event()
    forwarder = threading.Thread(target=outbox.run_forever, args=(stop_event,), kwargs={"progress": None})
    ids = []
    forwarder.start()
    try:
        for round_number in range(4):
            ids += [outbox.notify("Operators").send(f"Agent {round_number}-{n}", "link test") for n in range(100)]
            time.sleep(0.3)
            proxy.cut()
            time.sleep(1)
            proxy.restore()
        poll(lambda: outbox.stats()["buffered"] == 0, timeout=120, interval=0.2, message="agent buffer never drained")
    finally:
        stop_event.set()
        forwarder.join(timeout=30)
        proxy.close()
    parked_at_site = outbox.stats()["parked"]
    result = evaluate("agent link cut/restored x4", world, acked=ids, started=started,
                      note=f"site buffer empty; parked at site: {parked_at_site}")  # fmt: skip
    if parked_at_site:
        result["ok"] = False
    world.stop_dispatchers()
    return result


SCENARIOS = {
    "same-ids": scenario_same_ids,
    "web-kill": scenario_web_kill,
    "postgres-restart": scenario_postgres_restart,
    "dispatcher-kill": scenario_dispatcher_kill,
    "smtp-down": scenario_smtp_down,
    "smtp-hang": scenario_smtp_hang,
    "smtp-transient": scenario_smtp_transient_codes,
    "smtp-permanent": scenario_smtp_permanent_codes,
    "clock-skew": scenario_clock_skew,
    "operator-race": scenario_operator_race,
    "agent-link": scenario_agent_link,
}


def print_table(results):
    header = f"{'scenario':38} {'acked':>6} {'lost':>5} {'unexp':>6} {'dups':>5} {'bound':>6} {'non-term':>8} " \
             f"{'parked':>6} {'expect':>6} {'secs':>6}  ok"  # fmt: skip
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        if "skipped" in r:
            print(f"{r['scenario']:38} skipped: {r['skipped']}")
            continue
        print(f"{r['scenario']:38} {r['acked']:>6} {r['lost']:>5} {r['unexpected']:>6} {r['duplicates']:>5} "
              f"{r['dup_bound']:>6} {r['non_terminal']:>8} {r['parked']:>6} {r['expected_parked']:>6} "
              f"{r['seconds']:>6}  {'yes' if r['ok'] else 'NO'}")  # fmt: skip
    for r in results:
        if r.get("note"):
            print(f"  {r['scenario']}: {r['note']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="smaller loads and fewer faults (CI)")
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")

    world = World(short=args.short)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-chaos-") as tmp_dir:
            for name in names:
                print(f"== {name}: {SCENARIOS[name].__doc__.splitlines()[0]}", flush=True)
                world.smtp.reset()
                function = SCENARIOS[name]
                result = function(world, tmp_dir) if name == "agent-link" else function(world)
                if result is not None:
                    results.append(result)
                    print(f"   {json.dumps({k: v for k, v in result.items() if k != 'note'})}", flush=True)
    finally:
        world.close()
    print_table(results)
    out = ROOT / "bench-results" / "chaos.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"short": args.short, "results": results}, indent=2))
    failed = [r for r in results if "skipped" not in r and not r["ok"]]
    skipped = [r for r in results if "skipped" in r]
    print(f"\n{len(results) - len(failed) - len(skipped)} of {len(results)} scenarios passed"
          f"{f', {len(skipped)} skipped' if skipped else ''}; wrote {out.relative_to(ROOT)}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
