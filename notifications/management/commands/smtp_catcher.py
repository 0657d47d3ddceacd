"""manage.py smtp_catcher — a local SMTP server (aiosmtpd) that saves every message it receives
as an .eml file. For development and the `make run` demo only: it accepts anything."""

import re
import signal
import threading
import time
import uuid
from pathlib import Path

from aiosmtpd.controller import Controller
from django.core.management.base import BaseCommand

ID_HEADER = re.compile(rb"^X-Notification-Id:\s*([0-9a-fA-F-]{36})\s*$", re.IGNORECASE | re.MULTILINE)


class MaildirHandler:
    def __init__(self, maildir, report):
        self.maildir = maildir
        self.report = report

    async def handle_DATA(self, server, session, envelope):
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

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=2525)
        parser.add_argument("--maildir", default="var/mail")

    def handle(self, *args, host, port, maildir, **options):
        directory = Path(maildir)
        directory.mkdir(parents=True, exist_ok=True)
        controller = Controller(MaildirHandler(directory, self.stdout.write), hostname=host, port=port)
        controller.start()
        self.stdout.write(f"SMTP catcher listening on {host}:{port}; saving messages in {directory}/")
        stopped = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # Set from another thread: Event.set() inside a handler can deadlock with a wait().
            signal.signal(signum, lambda *_: threading.Thread(target=stopped.set, daemon=True).start())
        stopped.wait()
        controller.stop()
        self.stdout.write("SMTP catcher stopped")
