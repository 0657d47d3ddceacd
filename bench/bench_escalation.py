"""Escalation precision on PostgreSQL: how soon after its due time a step is taken when many
fall due at once.

``--count`` (1,000) high notifications to ``Operators`` (escalating to ``Shift-Leads`` by email),
ingested through the ingest path and marked Delivered (delivered and unread), have their first
step made due at one moment, ``--lead`` seconds ahead. Then a real worker starts
(``manage.py qcluster``, 2 task processes, the SMTP sink of tests/support/smtp.py as relay):
its every-minute sweep task becomes the waiting worker, which wakes at the due time
(notifications.dispatch.wait) and takes the steps. Figure: child ``created_at`` − due, p50,
p99 and maximum over the children (database clock). Target: p99 ≤ 5 s. Also checked: exactly
one child per parent, and every child delivered.

Writes bench-results/escalation.json. Usage: python bench/bench_escalation.py [--count 1000]
"""

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, fresh_database, percentile, setup_django, write_results
from tests.support.db import drop_postgres_database
from tests.support.processes import SmtpSink, manage, manage_output, poll, stop

TARGET_P99_SECONDS = 5.0


def configure(url: str, *, sink_port: int) -> None:
    """The sink as SMTP server; Operators escalating to Shift-Leads by email after 300 s."""
    config = {
        "smtp": {
            "host": "127.0.0.1",
            "port": sink_port,
            "security": "none",
            "from_address": "outbox@bench.invalid",
            "timeout_seconds": 10,
        },
        "lists": [
            {"name": "Shift-Leads", "email": ["lead@bench.invalid"]},
            {
                "name": "Operators",
                "email": ["operator@bench.invalid"],
                "escalation": [{"after_seconds": 300, "list": "Shift-Leads", "type": "email"}],
            },
        ],
        "sites": [{"site_id": "plant-a", "name": "Plant A"}],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(config, file)
    try:
        manage_output("outbox_config", "import", file.name, database=url)
    finally:
        Path(file.name).unlink()


def parents_raise(count: int, *, lead: float) -> datetime:
    """``count`` delivered, unacknowledged parents whose first step is due in ``lead`` s; the
    due time."""
    from notifications.clock import database_now
    from notifications.ingest import notification_validate, notifications_ingest
    from notifications.models import Notification
    from tests.support.payloads import make_payload

    items = []
    for n in range(count):
        item, rejection = notification_validate(
            make_payload(priority="high", subject=f"Alarm {n}", list_name="Operators"), site_id="plant-a"
        )
        assert item is not None, rejection
        items.append(item)
    for start in range(0, count, 500):
        notifications_ingest(site_id="plant-a", inputs=items[start : start + 500])
    due = database_now() + timedelta(seconds=lead)
    parents = Notification.objects.filter(escalation_step=0)
    assert parents.count() == count, "every parent starts its escalation at ingest"
    parents.update(
        status=Notification.Status.DELIVERED, next_attempt_at=None, delivered_at=database_now(), escalation_due_at=due
    )
    return due


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--lead", type=float, default=20.0, help="seconds from the setup to the due time")
    args = parser.parse_args()

    url = fresh_database("escalation")
    setup_django(url)
    from django.db import connection

    from notifications.models import Notification

    sink = SmtpSink()
    worker = None
    try:
        configure(url, sink_port=sink.port)
        due = parents_raise(args.count, lead=args.lead)
        connection.close()
        worker = manage("qcluster", database=url, stdout=None, stderr=None, OUTBOX_Q_WORKERS=2)
        children = Notification.objects.filter(escalation_of__isnull=False)
        poll(
            lambda: children.count() >= args.count,
            timeout=args.lead + 120,
            message="the steps were not all taken",
        )
        poll(
            lambda: children.filter(status=Notification.Status.DELIVERED).count() >= args.count,
            timeout=120,
            message="the children were not all delivered",
        )
        time.sleep(1)  # room for a duplicate to show
        lateness = sorted((created - due).total_seconds() for created in children.values_list("created_at", flat=True))
        delivered = sorted(
            (at - due).total_seconds() for at in children.values_list("delivered_at", flat=True) if at is not None
        )
        per_parent = children.values("escalation_of").distinct().count()
        total = children.count()
    finally:
        if worker is not None:
            stop(worker)
        sink.stop()
        connection.close()
    p50, p99 = percentile(lateness, 0.5), percentile(lateness, 0.99)
    print(
        f"{total} children for {per_parent} parents; created − due: p50 {p50:.2f} s, p99 {p99:.2f} s, "
        f"max {lateness[-1]:.2f} s, earliest {lateness[0]:.2f} s; delivered − due: p50 {percentile(delivered, 0.5):.2f} s, "
        f"p99 {percentile(delivered, 0.99):.2f} s"
    )
    checks = [
        check(
            "escalation precision p99 (child created − due)",
            p99,
            "s",
            f"≤ {TARGET_P99_SECONDS:g}",
            p99 <= TARGET_P99_SECONDS and lateness[0] >= 0,
            ratio=p99 / TARGET_P99_SECONDS,
        ),
        check(
            "escalation: one child per parent and step",
            total,
            "children",
            f"= {args.count}",
            total == per_parent == args.count,
        ),
    ]
    write_results(
        "escalation",
        checks,
        {
            "count": args.count,
            "p50": p50,
            "p99": p99,
            "max": lateness[-1],
            "min": lateness[0],
            "delivered_p50": percentile(delivered, 0.5),
            "delivered_p99": percentile(delivered, 0.99),
        },
    )
    drop_postgres_database(url)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
