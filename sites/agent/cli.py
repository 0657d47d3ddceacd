"""``python -m sites.agent``: operator commands for a site's outbox buffer.

Configuration comes from flags or the environment: ``--db`` / ``OUTBOX_AGENT_DB``,
``--central-url`` / ``OUTBOX_CENTRAL_URL``, ``--key`` / ``OUTBOX_SITE_KEY`` (prefer the
environment for the key: command lines are visible to every local user).

Exit status: 0 done; 1 the notification is unknown or not in the state the command needs;
2 usage or configuration error; 3 central rejected the site credential; 4 central unreachable.
"""

import argparse
import json
import logging
import os
import signal
import sys
import threading

from sites.agent.central import CentralUnreachable
from sites.agent.forwarder import CredentialRejected
from sites.agent.outbox import AgentNotConfigured, SiteOutbox

EXIT_OK, EXIT_NOT_FOUND, EXIT_CONFIG, EXIT_CREDENTIAL, EXIT_UNREACHABLE = 0, 1, 2, 3, 4

ENV_DB = "OUTBOX_AGENT_DB"
ENV_URL = "OUTBOX_CENTRAL_URL"
ENV_KEY = "OUTBOX_SITE_KEY"


class ConfigError(Exception):
    pass


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m sites.agent",
        description="Site outbox agent: buffer notifications locally and forward them to central.",
    )
    parser.add_argument("--db", help=f"SQLite buffer file (default: ${ENV_DB})")
    parser.add_argument("--central-url", help=f"central's base URL, e.g. https://outbox.example.com (${ENV_URL})")
    parser.add_argument("--key", help=f"the site API key (default: ${ENV_KEY}; prefer the environment)")
    parser.add_argument("--site-id", help="optional: stamp source_site_id (must match the key's site)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    send = commands.add_parser("send", help="buffer one notification and print its id")
    send.add_argument("--list", required=True, dest="list_name", help="notification list name, e.g. Operators")
    send.add_argument("--subject", required=True)
    send.add_argument("--body", required=True)
    send.add_argument("--type", default="email")
    send.add_argument("--type-data", help="JSON object with per-type extras")
    send.add_argument("--source-instance-id")
    send.add_argument("--source-script")

    status = commands.add_parser("status", help="where a notification is: Forwarding, Parked, or central's status")
    status.add_argument("notification_id")
    status.add_argument("--json", action="store_true", help="print the status record as JSON")

    forward = commands.add_parser("forward", help="forward buffered notifications until SIGTERM/SIGINT")
    forward.add_argument("--once", action="store_true", help="one sweep, then exit")
    forward.add_argument("--sweep-interval", type=float, default=10, help="seconds between sweeps (10)")
    forward.add_argument("--retry-interval", type=float, default=30, help="seconds before a failed row is retried (30)")
    forward.add_argument("--max-retries", type=int, default=50, help="park after this many failures; 0 = never (50)")
    forward.add_argument("--batch-size", type=int, default=500, help="notifications per batch request (500)")
    forward.add_argument("--timeout", type=float, default=10, help="seconds to wait for central (10)")
    forward.add_argument("--quiet", action="store_true", help="no per-request progress lines")

    parked = commands.add_parser("parked", help="list notifications parked at this site")
    parked.add_argument("--json", action="store_true")

    retry = commands.add_parser("retry", help="move a parked notification back to Forwarding")
    retry.add_argument("notification_id")

    discard = commands.add_parser("discard", help="delete a parked notification (prints what was discarded)")
    discard.add_argument("notification_id")

    stats = commands.add_parser("stats", help="buffered and parked counts")
    stats.add_argument("--json", action="store_true")
    return parser


def _setting(value, variable, what):
    value = value or os.environ.get(variable, "").strip()
    if not value:
        raise ConfigError(f"{what} is not configured: set {variable} or pass the flag")
    return value


def open_outbox(args, *, needs_central, **options):
    db = _setting(args.db, ENV_DB, "the buffer database (--db)")
    if needs_central:
        url = _setting(args.central_url, ENV_URL, "central's URL (--central-url)")
        key = _setting(args.key, ENV_KEY, "the site API key (--key)")
    else:
        url = args.central_url or os.environ.get(ENV_URL) or None
        key = args.key or os.environ.get(ENV_KEY) or None
    try:
        return SiteOutbox(db, url, key, site_id=args.site_id, **options)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def main(argv=None):
    args = build_parser().parse_args(argv)
    handler = globals()[f"command_{args.command}"]
    try:
        return handler(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except CredentialRejected as error:
        print(f"error: {error} — check {ENV_KEY} and that the site is active at central.", file=sys.stderr)
        return EXIT_CREDENTIAL
    except CentralUnreachable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE


# --- commands -----------------------------------------------------------------------------


def command_send(args):
    type_data = None
    if args.type_data:
        try:
            type_data = json.loads(args.type_data)
        except ValueError as error:
            raise ConfigError(f"--type-data is not JSON: {error}") from None
    with open_outbox(args, needs_central=False) as outbox:
        try:
            notification_id = outbox.notify(args.list_name).send(
                args.subject,
                args.body,
                source_instance_id=args.source_instance_id,
                source_script=args.source_script,
                type=args.type,
                type_data=type_data,
            )
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
    print(notification_id, flush=True)
    return EXIT_OK


def command_status(args):
    with open_outbox(args, needs_central=False) as outbox:
        try:
            record = outbox.status(args.notification_id)
        except ValueError as error:
            raise ConfigError(f"{args.notification_id!r} is not a notification id: {error}") from None
        except AgentNotConfigured:
            raise ConfigError(
                f"notification {args.notification_id} is not in this site's buffer; to ask central set "
                f"{ENV_URL} and {ENV_KEY}"
            ) from None
    if record is None:
        print(f"Unknown: neither this site's buffer nor central knows notification {args.notification_id}")
        return EXIT_NOT_FOUND
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        where = "at this site" if record.get("location") == "site" else "at central"
        print(f"{record['status']} ({where})")
        for name, value in record.items():
            if name not in ("status", "location") and value not in (None, ""):
                print(f"  {name}: {value}")
    return EXIT_OK


def command_forward(args):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    outbox = open_outbox(
        args,
        needs_central=True,
        sweep_interval=args.sweep_interval,
        retry_interval=args.retry_interval,
        max_retries=args.max_retries,
        batch_size=args.batch_size,
        timeout=args.timeout,
    )

    def progress(result):
        if not args.quiet:
            left = outbox.stats()
            print(
                f"forwarded {result.forwarded}, parked {result.parked}, retrying {result.retrying}, "
                f"dropped {result.dropped} — {left['buffered']} buffered, {left['parked']} parked",
                flush=True,
            )

    with outbox:
        print(f"forwarding {outbox.buffer.path} → {outbox.client.base_url} "
              f"({outbox.stats()['buffered']} buffered)", flush=True)  # fmt: skip
        stop = threading.Event()
        received = []

        def request_stop(signum, frame):
            # No printing here (it could re-enter a print the signal interrupted), and the event
            # is set from another thread: the handler may run while this thread holds the
            # event's lock inside Event.wait(), and setting it here would deadlock.
            received.append(signal.Signals(signum).name)
            threading.Thread(target=stop.set, daemon=True).start()

        previous = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            if args.once:
                result = outbox.forward_once(stop_event=stop, progress=progress)
                print(f"done: {json.dumps(result.as_dict())}", flush=True)
                return EXIT_OK
            outbox.run_forever(stop, progress=progress)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        print(f"{received[0] if received else 'stop'} received: finished the current request; stopped", flush=True)
    return EXIT_OK


def command_parked(args):
    with open_outbox(args, needs_central=False) as outbox:
        records = outbox.parked()
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        print("no parked notifications")
    for record in records:
        print(
            f"{record['notification_id']}  list={record['list_name']}  retries={record['retry_count']}  "
            f"last_attempt={record['last_attempt_at']}  subject={record['subject']!r}\n    {record['last_error']}"
        )
    return EXIT_OK


def command_retry(args):
    with open_outbox(args, needs_central=False) as outbox:
        done = _by_id(outbox.retry, args.notification_id)
    if not done:
        print(f"notification {args.notification_id} is not parked at this site; nothing changed")
        return EXIT_NOT_FOUND
    print(f"notification {args.notification_id} is Forwarding again (retry count reset)")
    return EXIT_OK


def command_discard(args):
    with open_outbox(args, needs_central=False) as outbox:
        payload = _by_id(outbox.discard, args.notification_id)
    if payload is None:
        print(f"notification {args.notification_id} is not parked at this site; nothing discarded")
        return EXIT_NOT_FOUND
    print(f"discarded {json.dumps(payload, ensure_ascii=False)}")
    return EXIT_OK


def command_stats(args):
    with open_outbox(args, needs_central=False) as outbox:
        stats = outbox.stats()
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"buffered: {stats['buffered']}\nparked: {stats['parked']}")
    return EXIT_OK


def _by_id(action, notification_id):
    try:
        return action(notification_id)
    except ValueError as error:
        raise ConfigError(f"{notification_id!r} is not a notification id: {error}") from None
