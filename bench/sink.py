"""A minimal SMTP sink for throughput benchmarks: accepts every message and counts them by
X-Notification-Id. aiosmtpd (tests/support/smtp.py) is the faithful server for tests, but its
per-message cost caps it near 400 messages/s on a 2-core machine, below what the dispatcher
is asked to reach; this sink speaks just enough SMTP (EHLO/HELO, MAIL, RCPT, DATA, RSET,
NOOP, QUIT) for smtplib, so a benchmark measures the sender, not the sink.

    python -m bench.sink --port 2526 --ids-file ids.txt   # prints "ready"; ids written on SIGTERM

With ``--delay-ms N`` every message is answered N ms after its end (the pace of a real relay;
other connections are served meanwhile). With ``--by-recipient`` each accepted message is
written once per envelope recipient, as ``<id> <recipient>`` (so that "exactly once" can be
checked per member of a list, not only per notification). With ``--fail-first`` the first DATA of every X-Notification-Id is answered
``451 4.3.0 try again later`` (a transient failure the dispatcher retries); later ones are
accepted. Only accepted messages are written to the ids file.
"""

import argparse
import asyncio
import re
import signal
from collections import Counter
from typing import cast

ID_HEADER = re.compile(rb"^X-Notification-Id:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class SinkProtocol(asyncio.Protocol):
    def __init__(
        self,
        counts: Counter[str | None],
        deferred: set[str | None] | None = None,
        delay: float = 0.0,
        by_recipient: bool = False,
    ) -> None:
        self.counts = counts
        self.by_recipient = by_recipient
        self.recipients: list[str] = []  # of the transaction under way (--by-recipient)
        self.delay = delay  # seconds before a message's reply (--delay-ms)
        self.replied_late = False
        self.deferred = deferred  # ids already answered 451 once (--fail-first), else None
        self.buffer = b""
        self.in_data = False
        self.scanned = 0  # in DATA: how much of the buffer is known not to hold the end marker

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # create_server hands stream transports
        self.transport.write(b"220 sink ESMTP\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        replies = []
        while True:
            if self.in_data:
                # The message ends at a line holding a single dot. Searched for as a whole, not
                # line by line: a message with a 100 KB attachment has thousands of lines.
                if self.buffer.startswith(b".\r\n"):
                    end, content = 0, b""
                else:
                    end = self.buffer.find(b"\r\n.\r\n", max(0, self.scanned - 4))
                    if end < 0:
                        self.scanned = len(self.buffer)
                        break
                    content, end = self.buffer[:end], end + 2
                self.buffer = self.buffer[end + 3 :]
                self.in_data, self.scanned = False, 0
                header_end = content.find(b"\r\n\r\n")
                match = ID_HEADER.search(content, 0, header_end if header_end >= 0 else len(content))
                notification_id = match.group(1).decode() if match else None
                if self.deferred is not None and notification_id not in self.deferred:
                    self.deferred.add(notification_id)
                    replies.append(b"451 4.3.0 try again later")
                else:
                    if self.by_recipient:
                        for recipient in self.recipients:
                            self.counts[f"{notification_id} {recipient}"] += 1
                    else:
                        self.counts[notification_id] += 1
                    replies.append(b"250 2.0.0 queued")
                    self.replied_late = self.delay > 0
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            verb = line[:4].upper()
            if verb == b"EHLO":
                replies.append(b"250-sink\r\n250-PIPELINING\r\n250 8BITMIME")
            elif verb in (b"HELO", b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                if verb in (b"MAIL", b"RSET"):
                    self.recipients = []
                elif verb == b"RCPT":
                    self.recipients.append(line[8:].strip(b" <>").decode("utf-8", "replace"))
                replies.append(b"250 OK")
            elif verb == b"DATA":
                self.in_data = True
                replies.append(b"354 end with .")
            elif verb == b"QUIT":
                self.transport.write(b"\r\n".join([*replies, b"221 bye"]) + b"\r\n")
                self.transport.close()
                return
            else:
                replies.append(b"502 command not implemented")
        if replies and self.replied_late:
            # The client waits for this reply before it sends anything else: nothing overtakes it.
            self.replied_late = False
            asyncio.get_running_loop().call_later(self.delay, self._write, b"\r\n".join(replies) + b"\r\n")
        elif replies:
            self.transport.write(b"\r\n".join(replies) + b"\r\n")

    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)


async def serve(
    port: int, ids_file: str, *, fail_first: bool = False, delay_ms: float = 0.0, by_recipient: bool = False
) -> None:
    counts: Counter[str | None] = Counter()
    deferred: set[str | None] | None = set() if fail_first else None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SinkProtocol(counts, deferred, delay_ms / 1000, by_recipient), "127.0.0.1", port, backlog=512
    )
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    print("ready", flush=True)
    await stopped.wait()
    server.close()
    with open(ids_file, "w") as out:
        for notification_id, count in counts.items():
            out.write(f"{notification_id}\n" * count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids-file", required=True)
    parser.add_argument("--fail-first", action="store_true", help="defer the first try of every message (451)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer each message this late (ms)")
    parser.add_argument("--by-recipient", action="store_true", help="write '<id> <recipient>' per recipient")
    args = parser.parse_args()
    asyncio.run(
        serve(
            args.port, args.ids_file, fail_first=args.fail_first, delay_ms=args.delay_ms, by_recipient=args.by_recipient
        )
    )


if __name__ == "__main__":
    main()
