"""`make test-pgbouncer`: the tests of connection and transaction semantics with every database connection going
through PgBouncer in transaction pooling mode (tests/support/pgbouncer.py), the way a
deployment behind PgBouncer runs: DATABASE_PGBOUNCER=true, here and in every process the
tests start.

TEST_PG_SERVER (default postgres://postgres@127.0.0.1:5432) is the PostgreSQL server behind
it. The test database is created through PgBouncer and dropped afterwards directly on the
server (PgBouncer keeps server connections to it open). Extra arguments go to pytest.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.pgbouncer import PgBouncer  # noqa: E402

# The tests whose outcome depends on how connections and transactions behave — what PgBouncer in
# transaction mode changes: the per-session settings PgBouncer must not keep; the claim (SKIP
# LOCKED, transaction-local planner settings, the lease in one statement) and its fairness;
# dispatchers and operators racing; the shared breaker and rate buckets; the counts kept by
# triggers (and their transaction-level advisory locks); real workers on the database broker;
# the idempotent insert and concurrent replays; escalation's due pass under SKIP LOCKED; the
# duplicates' locks (transaction-level, taken in one statement or in a transaction) under
# parallel posters. Left to `make test` (they talk to
# the database the same way through either): SMTP and HTTP behaviour, the console, the agent,
# and the slower multi-process tests whose database side the ones here already cover (the
# two-qcluster drain, escalation with killed workers, the schedules' timing).
SUITES = [
    "tests/dispatch/test_pgbouncer_settings.py",
    "tests/dispatch/test_claiming.py",
    "tests/dispatch/test_fair_claim.py",
    "tests/dispatch/test_concurrency.py",
    "tests/dispatch/test_operator_races.py",
    "tests/dispatch/test_breaker.py",
    "tests/dispatch/test_counts.py",
    "tests/dispatch/test_worker.py",
    "tests/dispatch/test_escalation.py",
    "tests/dispatch/test_suppression.py::test_concurrent_ingests_of_one_key_lose_no_count_and_make_one_anchor",
    "tests/dispatch/test_suppression.py::test_single_posts_and_batches_of_one_key_at_once_lose_no_count_and_make_one_anchor",
    "tests/dispatch/test_suppression.py::test_a_single_notification_with_a_key_is_decided_stored_and_counted_in_one_statement",
    # Of ingest, what a transaction decides: the insert, replays and conflicts, batches, paging.
    *(
        f"tests/api/test_ingest.py::{name}"
        for name in (
            "test_new_notification_is_created_with_201_and_its_status_record",
            "test_replay_with_same_content_returns_200_and_changes_nothing",
            "test_same_id_with_different_content_is_an_idempotency_conflict",
            "test_same_id_from_another_site_is_an_idempotency_conflict",
            "test_batch_answers_one_result_per_item_in_order_and_commits_the_valid_ones",
            "test_batch_with_the_same_id_twice_creates_one_row_and_replays_the_second",
            "test_list_shows_only_own_notifications_filtered_and_cursor_paginated",
            "test_authenticating_records_the_site_last_seen_time",
        )
    ),
    "tests/api/test_faults.py",
    "tests/sites/test_rate_limits.py",
]
SELECTION: list[str] = []


def main(argv: list[str]) -> int:
    import psycopg
    from psycopg import sql

    server = os.environ.get("TEST_PG_SERVER", "postgres://postgres@127.0.0.1:5432").rstrip("/")
    name = f"outbox_pgbouncer_{int(time.time())}_{os.getpid()}"
    with PgBouncer(upstream=server) as bouncer:
        print(f"PgBouncer (transaction mode) on port {bouncer.port} in front of {server}", flush=True)
        env = dict(os.environ, DATABASE_URL=bouncer.url(name), DATABASE_PGBOUNCER="true")
        try:
            # --reuse-db: the test database is not dropped through PgBouncer (which holds
            # connections to it) but below, on the server. A test still running after three
            # minutes prints every thread's stack (a wait on a pooled connection shows where).
            options = ["--reuse-db", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=180"]
            done = subprocess.run(
                [sys.executable, "-m", "pytest", *options, *SUITES, *SELECTION, *argv],
                cwd=ROOT,
                env=env,
                check=False,
            )
        finally:
            bouncer.stop()
            with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
                for database in (f"test_{name}", name):
                    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
