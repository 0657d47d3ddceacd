"""manage.py smtp_catcher — a local SMTP server (aiosmtpd) that saves every message it receives
as an .eml file. For development and the `make run` demo only: it accepts anything."""

import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from django.core.management.base import BaseCommand, CommandParser

ID_HEADER = re.compile(rb"^X-Notification-Id:\s*([0-9a-fA-F-]{36})\s*$", re.IGNORECASE | re.MULTILINE)


class MaildirHandler:
    def __init__(self, maildir: Path, report: Callable[[str], object]) -> None:
        self.maildir = maildir
        self.report = report

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.original_content or envelope.content
        match = ID_HEADER.search(content)
        name = match.group(1).decode() if match else uuid.uuid4().hex
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.maildir / f"{stamp}-{name}-{uuid.uuid4().hex[:6]}.eml"
        partial = path.with_suffix(".tmp")
        partial.write_bytes(content)
        partial.rename(path)  # readers never see half a message
        self.report(f"saved {path} (from {envelope.mail_from} to {', '.join(envelope.rcpt_tos)})")
        return "250 OK saved"


class Command(BaseCommand):
    help = "Run a local SMTP server that saves every received message under --maildir."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=2525)
        parser.add_argument("--maildir", default="var/mail")

    def handle(self, *args: Any, host: str, port: int, maildir: str, **options: Any) -> None:
        directory = Path(maildir)
        directory.mkdir(parents=True, exist_ok=True)
        # SIGTERM/SIGINT are blocked before the server's thread starts (threads inherit the mask)
        # and taken here with sigwait: no handler runs, so nothing interrupts a wait half-way.
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        controller = Controller(MaildirHandler(directory, self.stdout.write), hostname=host, port=port)
        controller.start()
        self.stdout.write(f"SMTP catcher listening on {host}:{port}; saving messages in {directory}/")
        signal.sigwait(stop_signals)
        controller.stop()
        self.stdout.write("SMTP catcher stopped")
