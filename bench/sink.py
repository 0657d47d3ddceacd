"""A minimal SMTP sink for throughput benchmarks: accepts every message and counts them by
X-Notification-Id. aiosmtpd (tests/support/smtp.py) is the faithful server for tests, but its
per-message cost caps it near 400 messages/s on a 2-core machine, below what the dispatcher
is asked to reach; this sink speaks just enough SMTP (EHLO/HELO, MAIL, RCPT, DATA, RSET,
NOOP, QUIT) for smtplib, so a benchmark measures the sender, not the sink.

    python -m bench.sink --port 2526 --ids-file ids.txt   # prints "ready"; ids written on SIGTERM
"""

import argparse
import asyncio
import re
import signal
from collections import Counter

ID_HEADER = re.compile(rb"^X-Notification-Id:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class SinkProtocol(asyncio.Protocol):
    def __init__(self, counts):
        self.counts = counts
        self.buffer = b""
        self.in_data = False
        self.message = []

    def connection_made(self, transport):
        self.transport = transport
        transport.write(b"220 sink ESMTP\r\n")

    def data_received(self, data):
        self.buffer += data
        replies = []
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            if self.in_data:
                if line == b".":
                    self.in_data = False
                    content = b"\r\n".join(self.message)
                    header_end = content.find(b"\r\n\r\n")
                    match = ID_HEADER.search(content, 0, header_end if header_end >= 0 else len(content))
                    self.counts[match.group(1).decode() if match else None] += 1
                    self.message = []
                    replies.append(b"250 2.0.0 queued")
                else:
                    self.message.append(line)
                continue
            verb = line[:4].upper()
            if verb == b"EHLO":
                replies.append(b"250-sink\r\n250-PIPELINING\r\n250 8BITMIME")
            elif verb in (b"HELO", b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                replies.append(b"250 OK")
            elif verb == b"DATA":
                self.in_data = True
                replies.append(b"354 end with .")
            elif verb == b"QUIT":
                self.transport.write(b"\r\n".join(replies + [b"221 bye"]) + b"\r\n")
                self.transport.close()
                return
            else:
                replies.append(b"502 command not implemented")
        if replies:
            self.transport.write(b"\r\n".join(replies) + b"\r\n")


async def serve(port, ids_file):
    counts = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SinkProtocol(counts), "127.0.0.1", port, backlog=512)
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    print("ready", flush=True)
    await stopped.wait()
    server.close()
    with open(ids_file, "w") as out:
        for notification_id, count in counts.items():
            out.write(f"{notification_id}\n" * count)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids-file", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.ids_file))


if __name__ == "__main__":
    main()
