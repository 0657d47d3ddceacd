# Outbox — everything a newcomer needs is `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)

.DEFAULT_GOAL := help
.PHONY: help install run test bench bench-ingest bench-dispatch bench-console bench-agent chaos chaos-short check clean

help:
	@echo "make run    - install into .venv, migrate SQLite, load the demo, start web + worker + SMTP catcher"
	@echo "make test   - install and run the whole test suite (DATABASE_URL=postgres://… for PostgreSQL)"
	@echo "make bench  - run every benchmark on PostgreSQL and print one summary table"
	@echo "make chaos  - fault-injection suite on PostgreSQL (needs root for the PostgreSQL restart)"

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

check: $(STAMP)
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run

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

bench-agent: $(STAMP)
	$(PY) bench/bench_agent.py

bench-console: $(STAMP)
	$(PY) bench/bench_console.py

# Every bench-* target runs even when an earlier one misses its target; the summary says.
bench: $(STAMP)
	-$(MAKE) --no-print-directory bench-ingest
	-$(MAKE) --no-print-directory bench-dispatch
	-$(MAKE) --no-print-directory bench-agent
	-$(MAKE) --no-print-directory bench-console
	$(PY) bench/summary.py

clean:
	rm -rf var/test_outbox.sqlite3* .pytest_cache bench-results test-artifacts
