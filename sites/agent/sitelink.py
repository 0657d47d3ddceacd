"""What the forwarder tells central about the site besides notifications, and what it does
for central's operators.

- **Heartbeat** (``POST /api/v1/sites/heartbeat/``): the agent's version, how many rows are
  buffered and parked, the oldest buffered row, the last successful forward and the last error.
  Central keeps the latest and answers with the operator commands waiting for this site.
- **Commands** (``{"id", "action", "notification_id"}``, action ``retry`` or ``discard``): each
  is executed once against the buffer, its result stored with the change in one transaction,
  then acknowledged (``POST /api/v1/sites/commands/{id}/ack/``). A command central hands out
  again (the acknowledgement was lost, or either side restarted) is answered from the stored
  result, never executed twice.
- **Parked reports** (``POST /api/v1/sites/parked/``): rows that became parked at the site, and
  rows that left that state (retried or discarded, here or by a command). Buffer triggers queue
  each change in the same transaction as the change itself; a report leaves the queue only
  after central took it, so central's view heals after any outage.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from sites.agent.buffer import COMMAND_MEMORY_DAYS, FORWARDING, PARKED, Buffer, ParkedReport, iso_utc
from sites.agent.central import CentralClient, CentralResponse, CentralUnreachable

logger = logging.getLogger("sites.agent")

LAST_FORWARD_AT = "last_forward_at"
REPORT_BATCH = 500
_MAX_DETAIL = 2000


@dataclass(frozen=True)
class Command:
    """One operator command from central."""

    command_id: str
    action: str
    notification_id: str


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
            commands.append(Command(item["id"], item["action"], item["notification_id"]))
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
    """Heartbeats, command execution and parked reports for one buffer and one central."""

    def __init__(
        self, *, buffer: Buffer, client: CentralClient, clock: Callable[[], datetime], agent_version: str
    ) -> None:
        self.buffer = buffer
        self.client = client
        self.clock = clock
        self.agent_version = agent_version
        self.last_error = ""
        self._unsupported_logged = False

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
        """The heartbeat body: this agent's state now."""
        counts = self.buffer.counts()
        return {
            "agent_version": self.agent_version,
            "buffered": counts[FORWARDING],
            "parked": counts[PARKED],
            "oldest_buffered_at": self.buffer.oldest_forwarding(),
            "last_forward_at": self.buffer.state_get(LAST_FORWARD_AT),
            "last_error": self.last_error,
        }

    # --- exchanges ----------------------------------------------------------------------------

    def heartbeat(self) -> list[Command]:
        """Send a heartbeat; returns the commands central answered with (none when central
        cannot be reached or does not take heartbeats, which is logged)."""
        try:
            response = self.client.post_heartbeat(self.heartbeat_report())
        except CentralUnreachable as error:
            logger.info("Heartbeat not sent: %s", error)
            return []
        if response.status != 200:
            self._answer_not_ok("heartbeat", response)
            return []
        return commands_from(response.json())

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
            )
            logger.warning(
                "Operator command %s from central: %s %s: %s (%s)",
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

    def sync(self, *, heartbeat: bool) -> int:
        """One exchange with central: a heartbeat (when ``heartbeat``) and the commands it
        brings, then acknowledgements and parked reports. Returns how many rows a retry
        command made due now."""
        retried = self.execute(self.heartbeat()) if heartbeat else 0
        self.acknowledge()
        self.report_parked()
        return retried

    def _answer_not_ok(self, what: str, response: CentralResponse) -> None:
        if response.status in (404, 405):
            if not self._unsupported_logged:
                self._unsupported_logged = True
                logger.warning(
                    "Central does not take the site's %s (%s): it is older than this agent; forwarding goes on",
                    what,
                    response.describe(),
                )
            return
        logger.warning("Central refused the site's %s: %s", what, response.describe())
