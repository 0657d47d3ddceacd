"""A minimal HTTP/1.1 sink for the webhook throughput benchmark: answers every POST with 204 on
keep-alive connections and counts requests by their ``webhook-id`` header. The tests' receiver
(tests/support/receivers.py, which verifies signatures) is the faithful one; this sink speaks
just enough HTTP for httpx, so the benchmark measures the sender, not the receiver.

    python -m bench.webhook_sink --port 8099 --ids-file ids.txt   # prints "ready"; ids written on SIGTERM
"""

import argparse
import asyncio
import signal
from collections import Counter

REPLY = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


class SinkProtocol(asyncio.Protocol):
    def __init__(self, counts: Counter[str | None]) -> None:
        self.counts = counts
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        replies = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self.buffer[:end].decode("latin-1")
            length = 0
            notification_id = None
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip())
                elif name == "webhook-id":
                    notification_id = value.strip()
            if len(self.buffer) < end + 4 + length:
                break
            self.buffer = self.buffer[end + 4 + length :]
            self.counts[notification_id] += 1
            replies += 1
        if replies:
            self.transport.write(REPLY * replies)


async def serve(port: int, ids_file: str) -> None:
    counts: Counter[str | None] = Counter()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ids-file", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.ids_file))


if __name__ == "__main__":
    main()
