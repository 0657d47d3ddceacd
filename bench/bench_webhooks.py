"""Webhook delivery throughput on PostgreSQL against a local HTTP sink in its own process
(bench/webhook_sink.py), beside a raw httpx ceiling measured in the same run:

1. **Raw ceiling**: ``--count`` signed webhook requests (the same JSON body and Standard
   Webhooks headers the adapter sends) posted with one shared httpx client from
   ``--concurrency`` threads — what the sink, httpx and this machine can take at all. Measured
   before and after the dispatch run; the higher of the two is the ceiling (this machine is
   shared and noisy, and the higher figure is the stricter target).
2. **Throughput**: ``--count`` queued webhook notifications delivered by ``--processes``
   dispatcher processes (``manage.py dispatch --once``) with the same total concurrency; every
   request is verified received exactly once (by ``webhook-id``). Target ≥ 0.5 × the ceiling.

Writes bench-results/webhooks.json. Usage: python bench/bench_webhooks.py [--count 5000] …
"""

import argparse
import base64
import secrets
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import check, dispatchers_run, fresh_database, setup_django, threads_run, write_results
from tests.support.processes import SmtpSink

BODY = "Pump 3 tripped on overcurrent at 10:00; operator attention required."
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def start_sink() -> SmtpSink:
    # SmtpSink runs any sink module with the same command line and "ready" handshake.
    return SmtpSink("bench.webhook_sink")


def raw_ceiling(count: int, concurrency: int) -> float:
    """Signed POSTs with bare httpx from ``concurrency`` threads: requests/s."""
    import httpx

    from notifications.adapters.webhook import webhook_signed

    sink = start_sink()
    url = f"http://127.0.0.1:{sink.port}/hook"
    ids = [str(uuid.uuid4()) for _ in range(count)]
    client = httpx.Client(
        timeout=10, limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    )
    created = datetime.now(UTC)

    def send(chunk: list[str]) -> None:
        for notification_id in chunk:
            row: Any = SimpleNamespace(
                notification_id=notification_id,
                type="webhook",
                list_name="Hooks",
                subject="Pump 3 tripped",
                body=BODY,
                type_data={},
                source_site_id="bench",
                created_at=created,
            )
            body, headers = webhook_signed(notification=row, secret=SECRET)
            response = client.post(url, content=body, headers=headers)
            assert response.status_code == 204

    seconds = threads_run(send, ids, concurrency)
    client.close()
    received = sink.stop()
    assert sorted(received) == sorted(ids), "the sink did not receive every raw request exactly once"
    return count / seconds


def ingest_backlog(count: int) -> list[str]:
    from notifications.ingest import notification_validate, notifications_ingest

    payload: dict[str, Any] = {"type": "webhook", "list_name": "Hooks", "subject": "Pump 3 tripped", "body": BODY}
    ids = []
    for start in range(0, count, 1000):
        items = []
        for _ in range(min(1000, count - start)):
            item, rejection = notification_validate(dict(payload, notification_id=str(uuid.uuid4())), site_id="bench")
            assert item is not None, rejection
            items.append(item)
        notifications_ingest(site_id="bench", inputs=items)
        ids += [str(item.notification_id) for item in items]
    return ids


def dispatch_throughput(url: str, count: int, concurrency: int, processes: int, batch_size: int) -> dict[str, Any]:
    from notifications.models import Notification, NotificationList, WebhookTarget

    sink = start_sink()
    hooks, _ = NotificationList.objects.get_or_create(name="Hooks")
    WebhookTarget.objects.filter(notification_list=hooks).delete()
    WebhookTarget.objects.create(notification_list=hooks, url=f"http://127.0.0.1:{sink.port}/hook", secret=SECRET)
    ids = ingest_backlog(count)
    per_process = max(1, concurrency // processes)
    started = time.perf_counter()
    dispatchers_run(url=url, processes=processes, concurrency=per_process, batch_size=batch_size)
    seconds = time.perf_counter() - started
    received = sink.stop()
    counts = Counter(received)
    return {
        "per_second": count / seconds,
        "seconds": seconds,
        "exactly_once": set(counts) == set(ids) and all(n == 1 for n in counts.values()),
        "delivered_rows": Notification.objects.filter(pk__in=ids, status=Notification.Status.DELIVERED).count(),
        "received": len(received),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=200)
    args = parser.parse_args()

    url = fresh_database("webhooks")
    setup_django(url)
    print(f"raw httpx ceiling: {args.count} signed requests, {args.concurrency} threads …", flush=True)
    before = raw_ceiling(args.count, args.concurrency)
    print(f"  {before:,.0f} requests/s", flush=True)
    print(f"dispatch: {args.count} webhook notifications, {args.processes} processes …", flush=True)
    result = dispatch_throughput(url, args.count, args.concurrency, args.processes, args.batch_size)
    print(f"  {result['per_second']:,.0f} notifications/s", flush=True)
    print("raw httpx ceiling again …", flush=True)
    after = raw_ceiling(args.count, args.concurrency)
    print(f"  {after:,.0f} requests/s", flush=True)
    ceiling = max(before, after)
    result["ceilings_per_second"] = [before, after]
    ratio = result["per_second"] / ceiling
    checks = [
        check("webhook raw httpx ceiling", ceiling, "req/s", "(reference)", True),
        check(
            "webhook dispatch throughput",
            result["per_second"],
            "notif/s",
            "≥ 0.5 × ceiling",
            ratio >= 0.5 and result["exactly_once"] and result["delivered_rows"] == args.count,
            ratio,
        ),
    ]
    write_results("webhooks", checks, {"args": vars(args), **result})
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
