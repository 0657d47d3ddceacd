"""A site script that sends without pause: ``python -m tests.support.agent_sender --db PATH``.

Sends one notification every ``--interval`` seconds (for at most ``--count``) through the agent's
``send()`` and prints ``<id> <unix time>`` the moment each ``send()`` returned, flushed, so the
caller knows what the site acknowledged and when, even if this process is then killed.
Standard library and the agent only, like a site's own scripts.
"""

import argparse
import sys
import time

from sites.agent import SiteOutbox


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--list", dest="list_name", default="Operators")
    args = parser.parse_args(argv)
    with SiteOutbox(args.db, None, None) as outbox:
        notifier = outbox.notify(args.list_name)
        for n in range(args.count):
            notification_id = notifier.send(f"Standby drill {n}", "Sent by the primary before it failed.")
            print(notification_id, repr(time.time()), flush=True)
            time.sleep(args.interval)  # the send rate of the drill, not a wait for an event
    return 0


if __name__ == "__main__":
    sys.exit(main())
