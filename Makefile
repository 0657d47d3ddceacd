# Outbox — everything a newcomer needs is `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)

.DEFAULT_GOAL := help
.PHONY: help install run test test-pg test-pgbouncer test-redis bench bench-ingest bench-dispatch bench-scaleout bench-peers bench-purge bench-console bench-agent bench-webhooks bench-login-flood bench-recovery bench-fairness bench-escalation bench-suppression chaos chaos-short check clean screenshots \
        agent-dist test-agent-pythons

help:
	@echo "make run    - install into .venv, migrate SQLite, load the demo, start web + worker + SMTP catcher"
	@echo "make test   - install and run the whole test suite (DATABASE_URL=postgres://… for PostgreSQL)"
	@echo "make test-pg - the whole suite on a fresh PostgreSQL database, dropped afterwards"
	@echo "make test-pgbouncer - the tests of connection and transaction semantics through PgBouncer (transaction mode)"
	@echo "make test-redis - the django-q2 Redis broker tests (needs Redis on 127.0.0.1:6379)"
	@echo "make bench  - run every benchmark on PostgreSQL and print one summary table"
	@echo "make chaos  - fault-injection suite on PostgreSQL (needs root for the PostgreSQL restart)"
	@echo "make screenshots - screenshots of each main console page (light and dark) in test-artifacts/"

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

run: $(STAMP)
	bash scripts/run.sh

test: $(STAMP)
	$(PY) manage.py check --fail-level WARNING
	$(PY) -m pytest $(PYTEST_ARGS)

# The whole suite on a fresh PostgreSQL database (TEST_PG_SERVER, trust or password in the URL),
# dropped afterwards whether the suite passes or not. TEST_PG_DB names it (default: unique).
TEST_PG_SERVER ?= postgres://postgres@127.0.0.1:5432
TEST_PG_DB     ?= outbox_testpg_$(shell date +%s)_$(shell echo $$$$)
PG_ADMIN = $(PY) -c "import sys, psycopg; from psycopg import sql; \
	psycopg.connect(sys.argv[1], autocommit=True).execute(sql.SQL(sys.argv[2]).format(sql.Identifier(sys.argv[3])))"
test-pg: $(STAMP)
	@echo "creating PostgreSQL database $(TEST_PG_DB)"
	@$(PG_ADMIN) "$(TEST_PG_SERVER)/postgres" "CREATE DATABASE {}" "$(TEST_PG_DB)"
	@trap 'echo "dropping PostgreSQL database $(TEST_PG_DB)"; \
		$(PG_ADMIN) "$(TEST_PG_SERVER)/postgres" "DROP DATABASE IF EXISTS {} WITH (FORCE)" "test_$(TEST_PG_DB)"; \
		$(PG_ADMIN) "$(TEST_PG_SERVER)/postgres" "DROP DATABASE IF EXISTS {} WITH (FORCE)" "$(TEST_PG_DB)"' EXIT; \
	trap 'exit 130' INT TERM; \
	DATABASE_URL="$(TEST_PG_SERVER)/$(TEST_PG_DB)" $(MAKE) --no-print-directory test

# The dispatch and ingest tests through PgBouncer in transaction mode (Debian's pgbouncer), with
# DATABASE_PGBOUNCER=true: TEST_PG_SERVER is the PostgreSQL server behind it.
test-pgbouncer: $(STAMP)
	TEST_PG_SERVER="$(TEST_PG_SERVER)" $(PY) scripts/test_pgbouncer.py $(PYTEST_ARGS)

# The django-q2 Redis broker's tests against the Redis at OUTBOX_TEST_REDIS_URL (default
# redis://127.0.0.1:6379/0), which must be reachable (a failure, not a skip, here).
test-redis: $(STAMP)
	OUTBOX_TEST_REDIS_REQUIRED=true $(PY) -m pytest tests/dispatch/test_redis_broker.py $(PYTEST_ARGS)

# Also the house rules on shape: the import contracts of pyproject.toml (no cycle in
# notifications/, the models import no adapter, leaf modules stay leaves) and no function in
# notifications/ graded D or worse by radon's cyclomatic complexity.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	@complex="$$($(VENV)/bin/radon cc -n D notifications)"; \
	if [ -n "$$complex" ]; then echo "Functions graded D or worse (radon cc -n D notifications):"; echo "$$complex"; exit 1; fi
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run

# Each main console page in headless Chromium, light and dark theme, checked with axe-core and
# written to test-artifacts/console-<page>-<theme>.png (DATABASE_URL=postgres://… for PostgreSQL).
screenshots: $(STAMP)
	OUTBOX_SCREENSHOTS=1 $(PY) -m pytest -q tests/admin/test_accessibility.py -k no_serious_accessibility
	@ls test-artifacts/console-*.png

# Fault injection (chaos/run.py): real gunicorn, dispatchers, PostgreSQL and SMTP under faults.
chaos: $(STAMP)
	$(PY) chaos/run.py

chaos-short: $(STAMP)
	$(PY) chaos/run.py --short

# Benchmarks need PostgreSQL: BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/…).
bench-ingest: $(STAMP)
	$(PY) bench/bench_ingest.py

bench-dispatch: $(STAMP)
	$(PY) bench/bench_dispatch.py

# 1, 2 and 4 dispatcher processes against a sink that takes 50 ms per message (a relay's pace),
# then a 20,000-row backlog drained by 1 and by 2 qcluster processes (every task process delivers).
bench-scaleout: $(STAMP)
	$(PY) bench/bench_scaleout.py

# django-post_office and Outbox, 2 processes each, deliver the same 10,000 mails to the same sink
# (post_office is installed for this benchmark only, into bench-results/.peers-venv).
bench-peers: $(STAMP)
	$(PY) bench/bench_peers.py

# The retention purge of 1,000,000 old rows while sites post at 200/s over HTTP.
bench-purge: $(STAMP)
	$(PY) bench/bench_purge.py

bench-agent: $(STAMP)
	$(PY) bench/bench_agent.py

# ROWS=10000000: the same pages at ten million rows (its own database; every page within 1 s).
bench-console: $(STAMP)
	$(PY) bench/bench_console.py $(if $(ROWS),--rows $(ROWS))

bench-webhooks: $(STAMP)
	$(PY) bench/bench_webhooks.py

# Ingest p95 while 16 clients flood the console's login page (from one address, then many).
bench-login-flood: $(STAMP)
	$(PY) bench/bench_login_flood.py

# Password fixed → first delivery, after a 4-minute outage (compressed) with a real worker.
bench-recovery: $(STAMP)
	$(PY) bench/bench_recovery.py

# A flood of 20,000 notifications from one site while two others send critical and normal ones:
# their delivery latency, fairness on and off, and the flood refused at the default limits.
bench-fairness: $(STAMP)
	$(PY) bench/bench_fairness.py

# Escalation precision: 1,000 unacknowledged notifications whose first step falls due at once.
bench-escalation: $(STAMP)
	$(PY) bench/bench_escalation.py

# Suppression's overhead: ingest and dispatch with 10 silences and dedup on, against off.
bench-suppression: $(STAMP)
	$(PY) bench/bench_suppression.py

# Every bench-* target runs even when an earlier one misses its target; the summary says.
bench: $(STAMP)
	-$(MAKE) --no-print-directory bench-ingest
	-$(MAKE) --no-print-directory bench-dispatch
	-$(MAKE) --no-print-directory bench-scaleout
	-$(MAKE) --no-print-directory bench-peers
	-$(MAKE) --no-print-directory bench-purge
	-$(MAKE) --no-print-directory bench-agent
	-$(MAKE) --no-print-directory bench-console
	-$(MAKE) --no-print-directory bench-webhooks
	-$(MAKE) --no-print-directory bench-login-flood
	-$(MAKE) --no-print-directory bench-recovery
	-$(MAKE) --no-print-directory bench-fairness
	-$(MAKE) --no-print-directory bench-escalation
	-$(MAKE) --no-print-directory bench-suppression
	$(PY) bench/summary.py

# The site agent: one-file zipapp and wheel in dist/ (standard library only, no venv needed).
agent-dist:
	$(PYTHON) scripts/agent_dist.py --out dist

# The agent's unit tests under every python3.8 … python3.13 found (absent ones are skipped with
# a note), each in a bare venv with only pytest + cryptography, plus the pre-3.35 SQLite path.
# AGENT_PYTHONS=3.8,3.13 limits the run to those versions.
test-agent-pythons: $(STAMP)
	$(PY) tests/agent/pythons.py $(if $(AGENT_PYTHONS),--versions $(AGENT_PYTHONS))

clean:
	rm -rf .pytest_cache bench-results test-artifacts dist
