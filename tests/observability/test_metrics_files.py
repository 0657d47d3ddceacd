"""The metrics directory keeps the live processes' files and one archive: the files of processes
that ended are merged into it (counters, histograms and summaries summed; live gauges dropped as
prometheus-client's mark_process_dead does) at every process start and whenever a web worker
ends, and the totals a scrape reports stay the same. Real processes count into a real
directory; totals are read with prometheus-client's own multiprocess collector."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from notifications.metrics_files import MetricsFilesCollector, metrics_directory_locked, metrics_files_compact
from tests.support.processes import Central, manage_output, poll

# A process that counts as Outbox's processes do (a counter with labels, a histogram, a summary,
# a live gauge), prints its process id and ends — or, given "stay", runs until its standard
# input closes.
COUNTING = """
import os, sys
from prometheus_client import Counter, Gauge, Histogram, Summary
n = int(sys.argv[1])
deliveries = Counter("outbox_test_deliveries", "Deliveries.", ["channel"])
deliveries.labels(channel="email").inc(n)
deliveries.labels(channel="sms").inc(1)
seconds = Histogram("outbox_test_seconds", "Seconds.", buckets=(0.1, 1.0))
for i in range(n):
    seconds.observe(0.05 if i % 2 else 0.5)
Summary("outbox_test_sizes", "Sizes.").observe(n)
Gauge("outbox_test_waiting", "Waiting.", multiprocess_mode="livesum").set(n)
print(os.getpid(), flush=True)
if sys.argv[2:] == ["stay"]:
    sys.stdin.read()
"""

Totals = dict[tuple[str, tuple], float]


def count(directory: Path, n: int) -> int:
    """Run a process that counts ``n`` into ``directory`` and ends; its process id."""
    done = subprocess.run(
        [sys.executable, "-c", COUNTING, str(n)],
        env=dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(directory)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout)


def counting_and_alive(directory: Path, n: int) -> "subprocess.Popen[str]":
    """A process that has counted ``n`` into ``directory`` and runs until its input closes."""
    process = subprocess.Popen(
        [sys.executable, "-c", COUNTING, str(n), "stay"],
        env=dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(directory)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and int(process.stdout.readline()) == process.pid
    return process


def totals(directory: Path) -> Totals:
    """Every sample one scrape of ``directory`` reports (prometheus-client's own collector)."""
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=str(directory))
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Totals:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("outbox_test_")
    }


def files(directory: Path) -> set[str]:
    return {name for name in os.listdir(directory) if name.endswith(".db")}


def own_files(pid: int) -> set[str]:
    return {f"counter_{pid}.db", f"histogram_{pid}.db", f"summary_{pid}.db", f"gauge_livesum_{pid}.db"}


ARCHIVES = {"counter_archive.db", "histogram_archive.db", "summary_archive.db"}
WAITING = ("outbox_test_waiting", ())


def test_ended_processes_files_merge_into_one_archive_and_the_totals_stay_the_same(tmp_path):
    ended = [count(tmp_path, n) for n in (1, 2, 3)]
    alive = counting_and_alive(tmp_path, 10)
    try:
        before = totals(tmp_path)
        assert before[("outbox_test_deliveries_total", (("channel", "email"),))] == 16
        assert before[WAITING] == 16  # a live gauge of ended processes still counts, until marked dead

        result = metrics_files_compact(directory=tmp_path)

        assert sorted(result.merged) == sorted(
            f"{kind}_{pid}.db" for pid in ended for kind in ("counter", "histogram", "summary")
        )
        assert result.processes == set(ended) and result.unreadable == []
        assert files(tmp_path) == ARCHIVES | own_files(alive.pid)
        after = totals(tmp_path)
        assert after == pytest.approx(
            {**before, WAITING: 10}
        )  # the same totals (sums of floats in another order); the live gauge counts the live one

        # More processes end; the next compaction adds them to the archive.
        ended += [count(tmp_path, 4), count(tmp_path, 5)]
        grown = totals(tmp_path)
        metrics_files_compact(directory=tmp_path)
        assert files(tmp_path) == ARCHIVES | own_files(alive.pid)
        assert totals(tmp_path) == pytest.approx({**grown, WAITING: 10})
        assert grown[("outbox_test_deliveries_total", (("channel", "email"),))] == 25
        assert grown[("outbox_test_deliveries_total", (("channel", "sms"),))] == 6
        assert grown[("outbox_test_seconds_bucket", (("le", "0.1"),))] == 11  # every second observation
        assert grown[("outbox_test_seconds_count", ())] == 25
        assert grown[("outbox_test_sizes_count", ())] == 6
    finally:
        alive.communicate("")
    last = totals(tmp_path)
    metrics_files_compact(directory=tmp_path)
    assert files(tmp_path) == ARCHIVES
    assert totals(tmp_path) == pytest.approx({key: value for key, value in last.items() if key != WAITING})


def test_a_compaction_with_nothing_ended_changes_nothing(tmp_path):
    alive = counting_and_alive(tmp_path, 3)
    try:
        before, listing = totals(tmp_path), files(tmp_path)
        result = metrics_files_compact(directory=tmp_path)
        assert (result.merged, result.processes) == ([], set())
        assert (totals(tmp_path), files(tmp_path)) == (before, listing)
    finally:
        alive.communicate("")


def test_a_file_that_cannot_be_read_is_left_in_place_and_named_and_the_others_merge(tmp_path):
    ended = count(tmp_path, 2)
    # A truncated file of an ended process: it claims 100 bytes and holds 8.
    broken = tmp_path / f"counter_{count(tmp_path, 1)}.db"
    broken.write_bytes((100).to_bytes(4, "little") + bytes(4))
    result = metrics_files_compact(directory=tmp_path)
    assert broken.name in files(tmp_path)
    assert [entry.split(":")[0] for entry in result.unreadable] == [broken.name]
    assert f"counter_{ended}.db" in result.merged and f"counter_{ended}.db" not in files(tmp_path)


def test_a_scrape_waits_for_a_compaction_under_way_and_sees_the_totals_whole(tmp_path):
    for n in (1, 2):
        count(tmp_path, n)
    expected = {key: value for key, value in totals(tmp_path).items() if key != WAITING}
    registry = CollectorRegistry(auto_describe=False)
    MetricsFilesCollector(registry, directory=tmp_path)
    scraped: list[Totals] = []
    scrape = threading.Thread(target=lambda: scraped.append(parse(generate_latest(registry).decode())))
    with metrics_directory_locked(tmp_path, shared=False):  # as a compaction holds the directory
        scrape.start()
        scrape.join(timeout=0.5)
        assert scrape.is_alive(), "the scrape read the files while a compaction held them"
    scrape.join(timeout=30)
    assert not scrape.is_alive()
    assert {key: value for key, value in scraped[0].items() if key != WAITING} == expected


@pytest.mark.slow
def test_a_process_start_merges_the_files_of_processes_that_ended(tmp_path):
    ended = [count(tmp_path, n) for n in (1, 2, 3)]
    before = totals(tmp_path)
    manage_output("check", PROMETHEUS_MULTIPROC_DIR=tmp_path)  # any manage.py command, qcluster included
    left = files(tmp_path)
    assert left >= ARCHIVES
    assert not left & set().union(*(own_files(pid) for pid in ended))
    assert totals(tmp_path) == {key: value for key, value in before.items() if key != WAITING}


@pytest.mark.slow
def test_the_web_server_merges_ended_processes_files_at_start_and_when_a_worker_ends(transactional_db, tmp_path):
    for n in (1, 2, 3):
        count(tmp_path, n)
    with Central(workers=2, PROMETHEUS_MULTIPROC_DIR=tmp_path) as central:
        assert not {name for name in files(tmp_path) if name.startswith(("counter_", "summary_"))} - ARCHIVES
        scraped = parse(requests.get(f"{central.url}/metrics", timeout=10).text)
        assert scraped[("outbox_test_deliveries_total", (("channel", "email"),))] == 6
        # Each web worker holds a histogram file of its own (notifications.metrics); end one.
        workers = [
            int(name[len("histogram_") : -3])
            for name in files(tmp_path)
            if name.startswith("histogram_") and name[len("histogram_") : -3].isdigit()
        ]
        assert workers
        os.kill(workers[0], signal.SIGTERM)
        poll(
            lambda: f"histogram_{workers[0]}.db" not in files(tmp_path),
            timeout=30,
            message="the ended worker's metrics file was not merged",
        )
        rescraped = parse(requests.get(f"{central.url}/metrics", timeout=10).text)
        assert rescraped == scraped
