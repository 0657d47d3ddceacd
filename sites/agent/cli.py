"""``python -m sites.agent`` (or ``python outbox-agent.pyz``, or ``outbox-agent``): operator
commands for a site's outbox buffer.

Configuration comes from flags, the environment, and a JSON configuration file
(``--config FILE`` / ``OUTBOX_AGENT_CONFIG``), in that order of precedence: ``--db`` /
``OUTBOX_AGENT_DB`` / ``"db"``, ``--central-url`` / ``OUTBOX_CENTRAL_URL`` / ``"central_url"``,
``--key`` / ``OUTBOX_SITE_KEY`` / ``"key"`` (prefer the environment or a file only its user can
read: command lines are visible to every local user), ``--ca-file`` / ``OUTBOX_CA_FILE``,
``--client-cert`` / ``OUTBOX_CLIENT_CERT``, ``--client-key`` / ``OUTBOX_CLIENT_KEY``, ``--proxy`` /
``HTTPS_PROXY`` or ``HTTP_PROXY``, ``--no-proxy`` / ``NO_PROXY``, ``--max-body-bytes`` /
``OUTBOX_MAX_BODY_BYTES``, the ``forward`` settings, and the local fallback relay
(``"fallback"``, the file only). See :data:`CONFIG_KEYS` and docs/site-agent.md.

Exit status: 0 done; 1 the notification is unknown or not in the state the command needs, or a
``doctor`` check failed; 2 usage or configuration error; 3 central rejected the site credential;
4 central unreachable; 5 a standby ``restore`` failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import uuid
from typing import Any, Callable

from sites.agent import __version__
from sites.agent.central import (
    CentralClient,
    CentralUnreachable,
    no_proxy_from_environment,
    proxy_from_environment,
)
from sites.agent.contract import MAX_BODY_BYTES, PRIORITIES
from sites.agent.doctor import doctor_failed, doctor_run
from sites.agent.fallback import fallback_config
from sites.agent.forwarder import CredentialRejected, ForwardResult
from sites.agent.outbox import FINAL_STATUSES, AgentNotConfigured, SiteOutbox
from sites.agent.standby import RPO_SECONDS, StandbyError, litestream_config, replica_from, standby_restore
from sites.agent.stopping import StopSignal

EXIT_OK, EXIT_NOT_FOUND, EXIT_CONFIG, EXIT_CREDENTIAL, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
EXIT_DOCTOR_FAILED = 1
EXIT_STANDBY = 5

ENV_DB = "OUTBOX_AGENT_DB"
ENV_URL = "OUTBOX_CENTRAL_URL"
ENV_KEY = "OUTBOX_SITE_KEY"
ENV_CA_FILE = "OUTBOX_CA_FILE"
ENV_CLIENT_CERT = "OUTBOX_CLIENT_CERT"
ENV_CLIENT_KEY = "OUTBOX_CLIENT_KEY"
ENV_MAX_BODY_BYTES = "OUTBOX_MAX_BODY_BYTES"
ENV_HEARTBEAT = "OUTBOX_AGENT_HEARTBEAT"
ENV_LITESTREAM_NAME = "OUTBOX_LITESTREAM"
ENV_CONFIG = "OUTBOX_AGENT_CONFIG"
DEFAULT_HEARTBEAT = 30.0

# The configuration file's settings: name -> (the JSON types it takes, the flag's default).
# Flags and environment variables win over the file.
CONFIG_KEYS: dict[str, tuple[tuple[type, ...], Any]] = {
    "db": ((str,), None),
    "central_url": ((str,), None),
    "key": ((str,), None),
    "site_id": ((str,), None),
    "ca_file": ((str,), None),
    "client_cert": ((str,), None),
    "client_key": ((str,), None),
    "proxy": ((str,), None),
    "no_proxy": ((str,), None),
    "max_body_bytes": ((int,), MAX_BODY_BYTES),
    "sweep_interval": ((int, float), 10.0),
    "retry_interval": ((int, float), 30.0),
    "max_retries": ((int,), 50),
    "batch_size": ((int,), 500),
    "timeout": ((int, float), 10.0),
    "heartbeat_interval": ((int, float), DEFAULT_HEARTBEAT),
    "fallback": ((dict,), None),
}


class ConfigError(Exception):
    """A setting is missing or wrong; the message names it."""


def version_text() -> str:
    """``outbox-site-agent 0.2.0 (Python 3.8.18, SQLite 3.40.1)``."""
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"outbox-site-agent {__version__} (Python {python}, SQLite {sqlite3.sqlite_version})"


def _prog() -> str:
    launched = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if launched.endswith(".pyz") or launched.startswith("outbox-agent"):
        return launched
    return "python -m sites.agent"


def build_parser() -> argparse.ArgumentParser:
    """The command line: global settings, then one command."""
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Site outbox agent: buffer notifications locally and forward them to central.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "--config", help=f"JSON configuration file; flags and the environment win over it (${ENV_CONFIG})"
    )
    parser.add_argument("--db", help=f"SQLite buffer file (default: ${ENV_DB})")
    parser.add_argument("--central-url", help=f"central's base URL, e.g. https://outbox.example.com (${ENV_URL})")
    parser.add_argument("--key", help=f"the site API key (default: ${ENV_KEY}; prefer the environment)")
    parser.add_argument("--site-id", help="optional: stamp source_site_id (must match the key's site)")
    network = parser.add_argument_group("connection to central")
    network.add_argument("--ca-file", help=f"PEM file of the CA(s) trusted for central's certificate (${ENV_CA_FILE})")
    network.add_argument("--client-cert", help=f"PEM client certificate for mutual TLS (${ENV_CLIENT_CERT})")
    network.add_argument("--client-key", help=f"PEM key of the client certificate (${ENV_CLIENT_KEY})")
    network.add_argument(
        "--proxy",
        help="http://[user:password@]host:port of an HTTP proxy; 'none' for a direct connection "
        "(default: $HTTPS_PROXY for https central, $HTTP_PROXY for http)",
    )
    network.add_argument("--no-proxy", help="hosts reached without the proxy, comma-separated (default: $NO_PROXY)")
    network.add_argument(
        "--max-body-bytes",
        type=int,
        help=f"central's request body limit; larger notifications are refused at send (${ENV_MAX_BODY_BYTES}, "
        f"default {MAX_BODY_BYTES})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    send = commands.add_parser("send", help="buffer one notification and print its id")
    send.add_argument("--list", required=True, dest="list_name", help="notification list name, e.g. Operators")
    send.add_argument("--subject", required=True)
    send.add_argument("--body", required=True)
    send.add_argument("--type", default="email")
    send.add_argument("--type-data", help="JSON object with per-type extras")
    send.add_argument("--source-instance-id")
    send.add_argument("--source-script")
    send.add_argument("--priority", default="normal", help=f"{' | '.join(PRIORITIES)} (normal)")
    send.add_argument("--dedup-key", help="central suppresses repeats with the same key (see its list settings)")

    status = commands.add_parser("status", help="where a notification is: Forwarding, Parked, or central's status")
    status.add_argument("notification_id")
    status.add_argument("--json", action="store_true", help="print the status record as JSON")

    forward = commands.add_parser("forward", help="forward buffered notifications until SIGTERM/SIGINT")
    forward.add_argument("--once", action="store_true", help="one sweep, then exit")
    forward.add_argument("--sweep-interval", type=float, help="seconds between sweeps (10)")
    forward.add_argument("--retry-interval", type=float, help="seconds before a failed row is retried (30)")
    forward.add_argument(
        "--max-retries",
        type=int,
        help="park after this many answers outside central's contract (never for an outage); 0 = never (50)",
    )
    forward.add_argument("--batch-size", type=int, help="notifications per batch request (500)")
    forward.add_argument("--timeout", type=float, help="seconds to wait for central (10)")
    forward.add_argument(
        "--heartbeat-interval",
        type=float,
        help=f"seconds between heartbeats to central; 0 = none (${ENV_HEARTBEAT}, default {DEFAULT_HEARTBEAT:g})",
    )
    forward.add_argument("--quiet", action="store_true", help="no per-request progress lines")

    parked = commands.add_parser("parked", help="list notifications parked at this site")
    parked.add_argument("--json", action="store_true")

    retry = commands.add_parser("retry", help="move a parked notification back to Forwarding")
    retry.add_argument("notification_id")

    discard = commands.add_parser("discard", help="delete a parked notification (prints what was discarded)")
    discard.add_argument("notification_id")

    stats = commands.add_parser("stats", help="buffered and parked counts")
    stats.add_argument("--json", action="store_true")

    watchdog = commands.add_parser("watchdog", help="ping a watchdog: this script is alive (sent by the forwarder)")
    watchdog.add_argument("name")
    watchdog.add_argument("--every", type=int, required=True, help="seconds between pings the script promises")
    watchdog.add_argument("--list", required=True, dest="list_name", help="who hears when the pings stop")
    watchdog.add_argument("--type", default="email", help="the channel of that notification (email)")

    acknowledgements = commands.add_parser(
        "acknowledgements", help="acknowledgements central sent for this site's notifications"
    )
    acknowledgements.add_argument("--since", help="only those this site received after this ISO-8601 time")
    acknowledgements.add_argument(
        "--consume", action="store_true", help="only those not handed over yet, and mark them handed over"
    )
    acknowledgements.add_argument("--json", action="store_true")

    acknowledge = commands.add_parser("acknowledge", help="the plant acknowledged a notification (sent to central)")
    acknowledge.add_argument("notification_id")
    acknowledge.add_argument("--by", default="", help="who acknowledged it")
    acknowledge.add_argument("--note", default="")

    clear = commands.add_parser("clear", help="the alarm behind a notification returned to normal (sent to central)")
    clear.add_argument("notification_id")
    clear.add_argument("--note", default="")

    def replica_options(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--replica", required=True, help="replica directory (e.g. a mounted share) or s3://bucket/path"
        )
        command.add_argument("--endpoint", help="S3-compatible endpoint URL (MinIO, Ceph, …) for an s3:// replica")
        command.add_argument("--region", help="bucket region for an s3:// replica")
        command.add_argument(
            "--force-path-style", action="store_true", help="path-style bucket addressing (most S3-compatible stores)"
        )

    standby_config = commands.add_parser(
        "standby-config", help="print a Litestream configuration replicating the buffer to a standby replica"
    )
    replica_options(standby_config)

    restore = commands.add_parser("restore", help="rebuild the buffer (--db) from a Litestream replica, on a standby")
    replica_options(restore)
    restore.add_argument("--litestream", help=f"the litestream executable (default: ${ENV_LITESTREAM_NAME} or PATH)")
    restore.add_argument("--force", action="store_true", help="replace an existing buffer file at --db")

    doctor = commands.add_parser(
        "doctor",
        help="check central, the key, the clock, SQLite, the buffer, forwarding, the disk and the local relay "
        "(OK/WARN/FAIL)",
    )
    doctor.add_argument("--timeout", type=float, help="seconds to wait for central (10)")
    doctor.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    return parser


def load_config(path: str | None) -> dict[str, Any]:
    """The settings of the JSON configuration file at ``path`` (None or empty: none), checked
    against :data:`CONFIG_KEYS`. ConfigError naming the file and the problem."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read the configuration file {path} ({ENV_CONFIG} / --config): {error}") from None
    except ValueError as error:
        raise ConfigError(f"the configuration file {path} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the configuration file {path} must hold a JSON object")
    for name, value in data.items():
        if name not in CONFIG_KEYS:
            raise ConfigError(
                f"the configuration file {path}: unknown setting {name!r} (known: {', '.join(CONFIG_KEYS)})"
            )
        types, _default = CONFIG_KEYS[name]
        if isinstance(value, bool) or not isinstance(value, types):
            names = {"int": "whole number", "float": "number", "dict": "JSON object"}
            wanted = names.get(types[-1].__name__, types[-1].__name__)
            raise ConfigError(f"the configuration file {path}: {name} must be a {wanted}, got {value!r}")
    return data


def _config(args: argparse.Namespace) -> dict[str, Any]:
    if not hasattr(args, "config_values"):
        args.config_values = load_config(args.config or os.environ.get(ENV_CONFIG, "").strip() or None)
    return dict(args.config_values)


def _optional(args: argparse.Namespace, name: str, variable: str | None) -> Any:
    """The setting ``name``: its flag, else the environment ``variable``, else the
    configuration file, else None."""
    flag = getattr(args, name, None)
    if flag is not None and flag != "":
        return flag
    if variable:
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return _config(args).get(name)


def _setting(args: argparse.Namespace, name: str, variable: str, what: str) -> str:
    value = _optional(args, name, variable)
    if not value:
        raise ConfigError(f"{what} is not configured: set {variable}, pass the flag, or set {name!r} in --config")
    return str(value)


def network_options(args: argparse.Namespace) -> dict[str, Any]:
    """TLS and proxy keyword arguments for SiteOutbox/CentralClient from flags, environment and
    the configuration file."""
    proxy = args.proxy
    if proxy is None and not (proxy_from_environment("https") or proxy_from_environment("http")):
        proxy = _config(args).get("proxy")
    if proxy is not None and proxy.strip().lower() in ("", "none", "direct"):
        proxy = ""
    no_proxy = args.no_proxy
    if no_proxy is None and not no_proxy_from_environment():
        no_proxy = _config(args).get("no_proxy")
    return {
        "ca_file": _optional(args, "ca_file", ENV_CA_FILE),
        "client_cert": _optional(args, "client_cert", ENV_CLIENT_CERT),
        "client_key": _optional(args, "client_key", ENV_CLIENT_KEY),
        "proxy": proxy,  # None: from the environment
        "no_proxy": no_proxy,  # None: from the environment
    }


def _max_body_bytes(args: argparse.Namespace) -> int:
    if args.max_body_bytes is not None:
        return int(args.max_body_bytes)
    text = os.environ.get(ENV_MAX_BODY_BYTES, "").strip()
    if not text:
        return int(_config(args).get("max_body_bytes", MAX_BODY_BYTES))
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{ENV_MAX_BODY_BYTES} must be a whole number of bytes, got {text!r}") from None


def _heartbeat_interval(args: argparse.Namespace) -> float:
    value = args.heartbeat_interval
    if value is None:
        text = os.environ.get(ENV_HEARTBEAT, "").strip()
        if not text:
            value = float(_config(args).get("heartbeat_interval", DEFAULT_HEARTBEAT))
        else:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"{ENV_HEARTBEAT} must be a number of seconds, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"the heartbeat interval must be 0 (none) or more seconds, got {value:g}")
    return float(value)


def _forward_setting(args: argparse.Namespace, name: str) -> Any:
    """A ``forward`` setting: its flag, else the configuration file, else the default."""
    flag = getattr(args, name, None)
    if flag is not None:
        return flag
    return _config(args).get(name, CONFIG_KEYS[name][1])


def _fallback(args: argparse.Namespace) -> dict[str, Any] | None:
    value = _config(args).get("fallback")
    return None if value is None else dict(value)


def open_outbox(args: argparse.Namespace, *, needs_central: bool, **options: Any) -> SiteOutbox:
    """A SiteOutbox from flags, environment and configuration file; ConfigError naming what is
    missing or wrong."""
    db = _setting(args, "db", ENV_DB, "the buffer database (--db)")
    url: str | None
    key: str | None
    if needs_central:
        url = _setting(args, "central_url", ENV_URL, "central's URL (--central-url)")
        key = _setting(args, "key", ENV_KEY, "the site API key (--key)")
    else:
        url = _optional(args, "central_url", ENV_URL) or None
        key = _optional(args, "key", ENV_KEY) or None
    try:
        return SiteOutbox(
            db,
            url,
            key,
            site_id=_optional(args, "site_id", None),
            max_body_bytes=_max_body_bytes(args),
            fallback=_fallback(args),
            **network_options(args),
            **options,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = globals()[f"command_{args.command.replace('-', '_')}"]
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
    except StandbyError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_STANDBY


# --- commands -----------------------------------------------------------------------------


def command_send(args: argparse.Namespace) -> int:
    """Buffer one notification; print its id."""
    type_data = None
    if args.type_data:
        try:
            type_data = json.loads(args.type_data)
        except ValueError as error:
            raise ConfigError(f"--type-data is not JSON: {error}") from None
        except RecursionError:
            raise ConfigError("--type-data is nested too deeply") from None
    with open_outbox(args, needs_central=False) as outbox:
        try:
            notification_id = outbox.notify(args.list_name).send(
                args.subject,
                args.body,
                source_instance_id=args.source_instance_id,
                source_script=args.source_script,
                type=args.type,
                type_data=type_data,
                priority=args.priority,
                dedup_key=args.dedup_key,
            )
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
    print(notification_id, flush=True)
    return EXIT_OK


def command_status(args: argparse.Namespace) -> int:
    """Print where a notification is."""
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
        print(status_text(record))
    return EXIT_OK


def status_text(record: dict[str, Any]) -> str:
    """A status record as printed: the status and where, then one line per field that says
    something (nested records as JSON)."""
    where = "at this site" if record.get("location") == "site" else "at central"
    heading = f"{record['status']} ({where})"
    if record.get("status") in FINAL_STATUSES and record.get("location") == "central":
        heading += " — final"
        if record.get("status") == "Suppressed":
            heading += f": kept by central without sending it ({record.get('suppressed_by') or 'reason not given'})"
    lines = [heading]
    for name, value in record.items():
        if name in ("status", "location", "final") or value in (None, "", [], {}):
            continue
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False)
        lines.append(f"  {name}: {value}")
    return "\n".join(lines)


def command_forward(args: argparse.Namespace) -> int:
    """Forward until SIGTERM/SIGINT (or Ctrl+Break on Windows), or one sweep with ``--once``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    outbox = open_outbox(
        args,
        needs_central=True,
        sweep_interval=_forward_setting(args, "sweep_interval"),
        retry_interval=_forward_setting(args, "retry_interval"),
        max_retries=_forward_setting(args, "max_retries"),
        batch_size=_forward_setting(args, "batch_size"),
        timeout=_forward_setting(args, "timeout"),
        heartbeat_interval=_heartbeat_interval(args),
    )

    def progress(result: ForwardResult) -> None:
        if not args.quiet:
            left = outbox.stats()
            print(
                f"forwarded {result.forwarded}, parked {result.parked}, retrying {result.retrying}, "
                f"dropped {result.dropped} — {left['buffered']} buffered, {left['parked']} parked",
                flush=True,
            )

    with outbox, StopSignal() as stop, stop.on_signals():
        client = outbox.client
        assert client is not None  # needs_central
        print(
            f"forwarding {outbox.buffer.path} → {client.base_url} ({client.route}; "
            f"{outbox.stats()['buffered']} buffered)",
            flush=True,
        )
        if args.once:
            try:
                result = outbox.forward_once(stop_event=stop, progress=progress)
            finally:
                # A refused key counts as central unreachable: the local relay still gets its turn.
                local = outbox.deliver_locally_once(stop_event=stop)
                if local.active:
                    print(
                        f"central unreachable: local relay delivered {local.delivered}, failed {local.failed}, "
                        f"unknown {local.unknown}",
                        flush=True,
                    )
            print(f"done: {json.dumps(result.as_dict())}", flush=True)
            return EXIT_OK
        outbox.run_forever(stop, progress=progress)
        print(f"{stop.reason} received: finished the current request; stopped", flush=True)
    return EXIT_OK


def _replica(args: argparse.Namespace) -> Any:
    return replica_from(
        args.replica, endpoint=args.endpoint, region=args.region, force_path_style=args.force_path_style
    )


def command_standby_config(args: argparse.Namespace) -> int:
    """Print Litestream's configuration for replicating this buffer to the replica."""
    db = _setting(args, "db", ENV_DB, "the buffer database (--db)")
    try:
        print(litestream_config(db_path=db, replica=_replica(args)), end="")
    except StandbyError as error:
        raise ConfigError(str(error)) from None
    return EXIT_OK


def command_restore(args: argparse.Namespace) -> int:
    """Rebuild the buffer from the replica (on the standby, before its forwarder starts)."""
    db = _setting(args, "db", ENV_DB, "the buffer database (--db)")
    try:
        replica = _replica(args)
    except StandbyError as error:
        raise ConfigError(str(error)) from None
    result = standby_restore(db_path=db, replica=replica, litestream=args.litestream, force=args.force)
    print(
        f"restored {result.db_path} from {args.replica}: {result.buffered} buffered, {result.parked} parked "
        f"(notifications sent within about {RPO_SECONDS:g} s before the primary failed may be missing); "
        "start the forwarder to send them on",
        flush=True,
    )
    return EXIT_OK


def command_doctor(args: argparse.Namespace) -> int:
    """Run every check; exit 1 when one failed."""
    db = _optional(args, "db", ENV_DB)
    url = _optional(args, "central_url", ENV_URL)
    key = _optional(args, "key", ENV_KEY)
    timeout = args.timeout if args.timeout is not None else float(_config(args).get("timeout", 10.0))
    client = None
    config_error = None
    if url and key:
        try:
            client = CentralClient(url, key, timeout=timeout, **network_options(args))
        except ValueError as error:
            config_error = str(error)
    elif url:
        config_error = f"the site API key is not configured: set {ENV_KEY} or pass --key"
    elif key:
        config_error = f"central's URL is not configured: set {ENV_URL} or pass --central-url"
    fallback: Any = None
    fallback_error = None
    try:
        fallback = fallback_config(_fallback(args))
    except ValueError as error:
        fallback_error = str(error)
    try:
        checks = doctor_run(
            db_path=db, client=client, config_error=config_error, fallback=fallback, fallback_error=fallback_error
        )
    finally:
        if client is not None:
            client.close()
    if args.json:
        print(json.dumps([check.as_dict() for check in checks], indent=2))
    else:
        print(version_text())
        for check in checks:
            print(check.line())
    return EXIT_DOCTOR_FAILED if doctor_failed(checks) else EXIT_OK


def command_parked(args: argparse.Namespace) -> int:
    """List the rows parked at this site."""
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


def command_retry(args: argparse.Namespace) -> int:
    """Parked → Forwarding."""
    with open_outbox(args, needs_central=False) as outbox:
        done = _by_id(outbox.retry, args.notification_id)
    if not done:
        print(f"notification {args.notification_id} is not parked at this site; nothing changed")
        return EXIT_NOT_FOUND
    print(f"notification {args.notification_id} is Forwarding again (retry count reset)")
    return EXIT_OK


def command_discard(args: argparse.Namespace) -> int:
    """Delete a parked row, printing what it was."""
    with open_outbox(args, needs_central=False) as outbox:
        payload = _by_id(outbox.discard, args.notification_id)
    if payload is None:
        print(f"notification {args.notification_id} is not parked at this site; nothing discarded")
        return EXIT_NOT_FOUND
    print(f"discarded {json.dumps(payload, ensure_ascii=False)}")
    return EXIT_OK


def command_stats(args: argparse.Namespace) -> int:
    """Print buffered and parked counts."""
    with open_outbox(args, needs_central=False) as outbox:
        stats = outbox.stats()
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"buffered: {stats['buffered']}\nparked: {stats['parked']}")
    return EXIT_OK


def command_watchdog(args: argparse.Namespace) -> int:
    """Record a watchdog ping; the forwarder sends it."""
    with open_outbox(args, needs_central=False) as outbox:
        try:
            outbox.watchdog(args.name, args.every, args.list_name, type=args.type)
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None
    return EXIT_OK


def command_acknowledgements(args: argparse.Namespace) -> int:
    """Print the acknowledgements central sent, oldest first."""
    with open_outbox(args, needs_central=False) as outbox:
        try:
            records = outbox.acknowledgements(args.since, consume=args.consume)
        except ValueError as error:
            raise ConfigError(f"--since: {error}") from None
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    for record in records:
        by = f" by {record['acknowledged_by']}" if record["acknowledged_by"] else ""
        note = f" — {record['note']}" if record["note"] else ""
        print(
            f"{record['notification_id']}  acknowledged {record['acknowledged_at']} via "
            f"{record['acknowledged_via'] or '?'}{by}{note}  (received {record['received_at']})"
        )
    return EXIT_OK


def command_acknowledge(args: argparse.Namespace) -> int:
    """Buffer the plant's acknowledgement for central."""
    with open_outbox(args, needs_central=False) as outbox:
        _by_id(
            lambda notification_id: outbox.acknowledge(notification_id, by=args.by, note=args.note),
            args.notification_id,
        )
    print(f"acknowledgement of {args.notification_id} buffered; the forwarder sends it to central")
    return EXIT_OK


def command_clear(args: argparse.Namespace) -> int:
    """Buffer the plant's clearing for central."""
    with open_outbox(args, needs_central=False) as outbox:
        _by_id(lambda notification_id: outbox.clear(notification_id, note=args.note), args.notification_id)
    print(f"clearing of {args.notification_id} buffered; the forwarder sends it to central")
    return EXIT_OK


def _by_id(action: Callable[[str], Any], notification_id: str) -> Any:
    try:
        uuid.UUID(notification_id)
    except ValueError as error:
        raise ConfigError(f"{notification_id!r} is not a notification id: {error}") from None
    try:
        return action(notification_id)
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from None
