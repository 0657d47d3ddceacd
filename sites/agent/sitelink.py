"""What the forwarder tells central about the site besides notifications, and what it does
for central's operators.

- **Watchdog pings** (``POST /api/v1/sites/watchdogs/``): the latest ping of each watchdog the
  site's scripts keep (one row per name in the buffer), with ``pinged_at``, sent before the
  heartbeat so that central never sees the site come back before its watchdogs' pings.
- **Heartbeat** (``POST /api/v1/sites/heartbeat/``): the agent's version, how many rows are
  buffered and parked, the oldest buffered row, the last successful forward, the last error
  (which also says when central is rate-limiting the site, or had refused the key until
  recently), ``capabilities`` (``["acknowledged"]``), ``server_errors`` (rows central answered
  500 to more than once) and ``fallback`` (the local relay's state, when one is configured).
  Central keeps the latest and answers with the commands waiting for this site.
- **Commands** (``{"id", "action", "notification_id", …}``): ``retry`` and ``discard`` from
  central's operators, ``acknowledged`` when a person acknowledged a notification of this site.
  Each is executed once against the buffer, its result stored with the change in one
  transaction, then acknowledged (``POST /api/v1/sites/commands/{id}/ack/``). A command central
  hands out again (the acknowledgement was lost, or either side restarted) is answered from the
  stored result, never executed (or stored) twice.
- **Parked reports** (``POST /api/v1/sites/parked/``): rows that became parked at the site, and
  rows that left that state (retried or discarded, here or by a command). Buffer triggers queue
  each change in the same transaction as the change itself; a report leaves the queue only
  after central took it, so central's view heals after any outage.
- **Acknowledge / clear** (``POST /api/v1/notifications/{id}/ack/`` or ``…/clear/``): the plant's
  own calls, buffered, sent once the notification itself has reached central.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable

from sites.agent.buffer import (
    ACKNOWLEDGEMENT_FIELDS,
    COMMAND_MEMORY_DAYS,
    FORWARDING,
    PARKED,
    Buffer,
    ParkedReport,
    iso_utc,
)
from sites.agent.central import CentralClient, CentralResponse, CentralUnreachable, one_line
from sites.agent.state import LinkState

if TYPE_CHECKING:
    from sites.agent.fallback import LocalFallback

logger = logging.getLogger("sites.agent")

LAST_FORWARD_AT = "last_forward_at"
REPORT_BATCH = 500
CAPABILITIES = ["acknowledged"]
# An acknowledge/clear call central answers 404 to (it does not hold the notification, or it is
# older than this agent) is tried this many times, retry_interval apart, then dropped.
SITE_ACTION_NOT_FOUND_TRIES = 5
SITE_ACTION_BATCH = 100
_MAX_DETAIL = 2000
_MAX_HEARTBEAT_ERROR = 1000


@dataclass(frozen=True)
class Command:
    """One command from central; ``details`` holds an acknowledgement's fields."""

    command_id: str
    action: str
    notification_id: str
    details: dict[str, Any] = field(default_factory=dict)


def commands_from(answer: Any) -> list[Command]:
    """The well-formed commands in central's heartbeat answer (malformed ones are logged)."""
    items = answer.get("commands") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        return []
    commands = []
    for item in items:
        if (
            isinstance(item, dict)
            and isinstance(item.get("id"), str)
            and isinstance(item.get("action"), str)
            and isinstance(item.get("notification_id"), str)
        ):
            details = {
                name: (item[name] if isinstance(item.get(name), str) else None) for name in ACKNOWLEDGEMENT_FIELDS
            }
            commands.append(Command(item["id"], item["action"], item["notification_id"], details))
        else:
            logger.warning("Ignoring a malformed command from central: %.200r", item)
    return commands


def _report_item(report: ParkedReport) -> dict[str, Any]:
    if not report.parked or report.row is None:
        return {"notification_id": report.notification_id, "outcome": report.outcome, "changed_at": report.changed_at}
    row = report.row
    try:
        payload = json.loads(row.payload)
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return {
        "notification_id": row.notification_id,
        "type": payload.get("type") or "",
        "list_name": payload.get("list_name") or "",
        "subject": payload.get("subject") or "",
        "source_instance_id": payload.get("source_instance_id") or "",
        "source_script": payload.get("source_script") or "",
        "site_enqueued_at": payload.get("site_enqueued_at") or row.created_at,
        "reason": row.last_error,
        "retry_count": row.retry_count,
        "parked_at": row.last_attempt_at or row.created_at,
    }


class SiteLink:
    """Watchdog pings, heartbeats, command execution, parked reports and the site's
    acknowledge/clear calls, for one buffer and one central."""

    def __init__(
        self,
        *,
        buffer: Buffer,
        client: CentralClient,
        clock: Callable[[], datetime],
        agent_version: str,
        state: LinkState | None = None,
        fallback: LocalFallback | None = None,
        retry_interval: float = 30.0,
    ) -> None:
        self.buffer = buffer
        self.client = client
        self.clock = clock
        self.agent_version = agent_version
        self.state = state if state is not None else LinkState(buffer=buffer, clock=clock)
        self.fallback = fallback
        self.retry_interval = float(retry_interval)
        self.last_error = ""
        self._unsupported_logged: set[str] = set()
        self._heartbeat_reached = True

    # --- state ---------------------------------------------------------------------------------

    def record_sweep(self, *, forwarded: int, errors: list[str]) -> None:
        """Remember what a sweep saw: when it last forwarded, and the error that is current."""
        if forwarded:
            self.buffer.state_set(LAST_FORWARD_AT, iso_utc(self.clock()))
        if errors:
            self.last_error = errors[-1][:_MAX_DETAIL]
        elif forwarded:
            self.last_error = ""

    def heartbeat_report(self) -> dict[str, Any]:
        """The heartbeat body: this agent's state now. New fields are sent only when they say
        something (``server_errors`` when a row is affected, ``fallback`` when one is configured)."""
        counts = self.buffer.counts()
        snapshot = self.state.snapshot()
        errors = [snapshot.rate_limit_line(), snapshot.key_refused_episode, self.last_error]
        distinct: list[str] = []
        for error in errors:
            if error and error not in distinct:
                distinct.append(error)
        report: dict[str, Any] = {
            "agent_version": self.agent_version,
            "buffered": counts[FORWARDING],
            "parked": counts[PARKED],
            "oldest_buffered_at": self.buffer.oldest_forwarding(),
            "last_forward_at": self.buffer.state_get(LAST_FORWARD_AT),
            "last_error": one_line("; ".join(distinct), _MAX_HEARTBEAT_ERROR) if distinct else "",
            "capabilities": list(CAPABILITIES),
        }
        rows, since, last_error = self.buffer.server_error_summary()
        if rows:
            report["server_errors"] = {"rows": rows, "since": since, "last_error": one_line(last_error)}
        if self.fallback is not None:
            report["fallback"] = self.fallback.report()
        return report

    # --- exchanges ----------------------------------------------------------------------------

    def heartbeat(self) -> list[Command]:
        """Send a heartbeat; returns the commands central answered with (none when central
        cannot be reached or does not take heartbeats, which is logged)."""
        report = self.heartbeat_report()
        try:
            response = self.client.post_heartbeat(report)
        except CentralUnreachable as error:
            self._heartbeat_reached = False
            self.state.failed(str(error))
            logger.info("Heartbeat not sent: %s", error)
            return []
        self._heartbeat_reached = response.status < 500
        self._record_answer(response)
        episode = self.state.snapshot().key_refused_episode
        if episode and response.status < 500 and response.status not in (401, 403, 429):
            # Carried to central (or central is too old to take heartbeats): said once.
            self.state.key_episode_reported(episode)
        if response.status != 200:
            self._answer_not_ok("heartbeat", response)
            return []
        return commands_from(response.json())

    def _record_answer(self, response: CentralResponse) -> None:
        """What an answer to a site request says about the link (see sites.agent.state)."""
        if response.status in (401, 403):
            self.state.key_refused(response.status, response.describe())
        elif response.status >= 500:
            self.state.failed(response.describe())
        else:
            self.state.reached()

    def execute(self, commands: list[Command]) -> int:
        """Execute each command once (see the module docstring); returns how many retries were
        done now (their rows are due at once)."""
        retried = 0
        for command in commands:
            record = self.buffer.command_execute(
                command_id=command.command_id,
                action=command.action,
                notification_id=command.notification_id,
                now=iso_utc(self.clock()),
                details=command.details,
            )
            log = logger.info if command.action == "acknowledged" else logger.warning
            log(
                "Command %s from central: %s %s: %s (%s)",
                command.command_id,
                command.action,
                command.notification_id,
                record.result,
                record.detail,
            )
            if record.result == "done" and record.action == "retry":
                retried += 1
        return retried

    def acknowledge(self) -> int:
        """Send the result of every executed, unacknowledged command; returns how many central
        took. A command central no longer knows (404) is acknowledged locally too."""
        taken = 0
        for record in self.buffer.commands_unacknowledged():
            try:
                response = self.client.post_command_ack(record.command_id, result=record.result, detail=record.detail)
            except CentralUnreachable as error:
                logger.info("Command acknowledgements not sent: %s", error)
                break
            if response.status in (200, 404):
                now = self.clock()
                self.buffer.command_acknowledged(
                    record.command_id,
                    now=iso_utc(now),
                    forget_before=iso_utc(now - timedelta(days=COMMAND_MEMORY_DAYS)),
                )
                taken += 1
            else:
                self._answer_not_ok("command acknowledgement", response)
                break
        return taken

    def report_parked(self) -> int:
        """Send pending parked-state changes, in batches; returns how many central took. A
        batch central refuses as invalid (400) is logged and dropped: resending cannot fix it."""
        sent = 0
        while True:
            reports = self.buffer.parked_reports(limit=REPORT_BATCH)
            if not reports:
                return sent
            body = {
                "parked": [_report_item(report) for report in reports if report.parked],
                "unparked": [_report_item(report) for report in reports if not report.parked],
            }
            try:
                response = self.client.post_parked(body)
            except CentralUnreachable as error:
                logger.info("Parked report not sent: %s", error)
                return sent
            if response.status == 400:
                logger.error("Central refused a parked report of %d rows: %s", len(reports), response.describe())
            elif response.status != 200:
                self._answer_not_ok("parked report", response)
                return sent
            sent += self.buffer.parked_reports_sent(report.report_id for report in reports)
            if len(reports) < REPORT_BATCH:
                return sent

    def send_pings(self) -> int:
        """Send each watchdog's latest ping central has not taken yet; returns how many it took.
        Pings wait in the buffer while central cannot take them; a ping central refuses as
        invalid (400), or a central without the watchdog endpoint (404), is logged and not
        resent (the next ping is sent as usual)."""
        taken = 0
        for ping in self.buffer.watchdogs_unsent():
            body: dict[str, Any] = {
                "name": ping.name,
                "every_seconds": ping.every_seconds,
                "list_name": ping.list_name,
                "pinged_at": ping.pinged_at,
            }
            if ping.type != "email":
                body["type"] = ping.type
            try:
                response = self.client.post_watchdog(body)
            except CentralUnreachable as error:
                logger.info("Watchdog pings not sent: %s", error)
                return taken
            if response.status == 200:
                self.buffer.watchdog_sent(ping.name, pinged_at=ping.pinged_at)
                taken += 1
            elif response.status == 400:
                logger.error("Central refused the ping of watchdog %r: %s", ping.name, response.describe())
                self.buffer.watchdog_sent(ping.name, pinged_at=ping.pinged_at)
            elif response.status in (404, 405):
                self._answer_not_ok("watchdog pings", response)
                self.buffer.watchdog_sent(ping.name, pinged_at=ping.pinged_at)
            else:
                self._answer_not_ok("watchdog pings", response)
                return taken
        return taken

    def send_site_actions(self) -> int:
        """Send the plant's acknowledge/clear calls whose notification has reached central;
        returns how many central took. 404 is tried a few times, then the call is dropped with a
        log line; 400 drops it at once (resending cannot fix it)."""
        taken = 0
        now = self.clock()
        for action in self.buffer.site_actions_due(now=iso_utc(now), limit=SITE_ACTION_BATCH):
            what = "acknowledgement" if action.action == "ack" else "clearing"
            try:
                response = self.client.post_site_action(action.notification_id, action.action, action.body)
            except CentralUnreachable as error:
                logger.info("Site %s calls not sent: %s", what, error)
                return taken
            status = response.status
            if status == 200:
                self.buffer.site_action_sent(action.action_id)
                taken += 1
            elif status == 400:
                logger.error(
                    "Central refused the %s of %s; dropped: %s", what, action.notification_id, response.describe()
                )
                self.buffer.site_action_sent(action.action_id)
            elif status in (404, 405) and action.not_found + 1 >= SITE_ACTION_NOT_FOUND_TRIES:
                logger.error(
                    "Central does not know notification %s (%s, %d tries); its %s is dropped",
                    action.notification_id,
                    response.describe(),
                    action.not_found + 1,
                    what,
                )
                self.buffer.site_action_sent(action.action_id)
            elif status in (404, 405):
                self.buffer.site_action_retry(
                    action.action_id,
                    error=response.describe(),
                    next_attempt_at=iso_utc(now + timedelta(seconds=self.retry_interval)),
                    not_found=True,
                )
            else:
                # Unreachable-like answers (401/403, 429, 5xx …): nothing counted, tried next cycle.
                self._answer_not_ok(f"{what} call", response)
                return taken
        return taken

    def sync(self, *, heartbeat: bool, pings: bool = True) -> int:
        """One exchange with central: watchdog pings (when ``pings`` or ``heartbeat``: always
        before a heartbeat), a heartbeat (when ``heartbeat``) and the commands it brings, then
        command acknowledgements, parked reports and the site's acknowledge/clear calls. Returns
        how many rows a retry command made due now."""
        if pings or heartbeat:
            self.send_pings()
        retried = 0
        if heartbeat:
            retried = self.execute(self.heartbeat())
            if not self._heartbeat_reached:
                return retried  # the rest would only wait out the same outage, request by request
        self.acknowledge()
        self.report_parked()
        self.send_site_actions()
        return retried

    def _answer_not_ok(self, what: str, response: CentralResponse) -> None:
        if response.status in (404, 405):
            if what not in self._unsupported_logged:
                self._unsupported_logged.add(what)
                logger.warning(
                    "Central does not take the site's %s (%s): it is older than this agent; forwarding goes on",
                    what,
                    response.describe(),
                )
            return
        logger.warning("Central refused the site's %s: %s", what, response.describe())
