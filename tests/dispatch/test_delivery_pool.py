"""The pass's delivery threads (notifications.dispatch._Deliveries): every queued delivery runs
once and its result is collected once; the pass thread waits for a group of results, not longer
than needed; a delivery that raises is handed to the pass thread; a failed pass drops what was
only queued."""

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from notifications.dispatch import _Deliveries


def batch() -> Any:
    return SimpleNamespace(pending=0)


def returning(value: str, *, after: threading.Event | None = None, record: list[str] | None = None) -> Any:
    """A delivery call returning ``value`` (once ``after`` is set), recording it in ``record``."""

    def call() -> Any:
        if after is not None:
            after.wait(10)
        if record is not None:
            record.append(value)
        return value

    return call


def test_every_delivery_runs_once_and_is_collected_once():
    owner = batch()
    ran: list[int] = []
    lock = threading.Lock()

    def call(number: int) -> Any:
        with lock:
            ran.append(number)
        return number

    collected: list[Any] = []
    with _Deliveries(threads=4) as pool:
        for number in range(200):
            pool.submit(owner, call, number)
        assert owner.pending == 200
        while len(collected) < 200:
            collected += [result for _, result, _ in pool.collect(0.02)]
        assert pool.outstanding == 0
    assert sorted(ran) == sorted(collected) == list(range(200))


def test_collect_returns_as_soon_as_nothing_is_left_in_flight():
    with _Deliveries(threads=2) as pool:
        pool.submit(batch(), returning("done"))
        started = time.monotonic()
        assert [result for _, result, _ in pool.collect(5.0)] == ["done"]
        assert time.monotonic() - started < 1


def test_collect_waits_the_window_for_more_results():
    release = threading.Event()
    with _Deliveries(threads=2) as pool:
        pool.submit(batch(), returning("fast"))
        pool.submit(batch(), returning("slow", after=release))
        threading.Timer(0.1, release.set).start()
        results = [result for _, result, _ in pool.collect(2.0)]
    assert results == ["fast", "slow"]


def test_a_delivery_that_raises_is_handed_back():
    def broken() -> Any:
        raise RuntimeError("adapter bug")

    with _Deliveries(threads=1) as pool:
        pool.submit(batch(), broken)
        ((_, result, error),) = pool.collect(0.02)
    assert result is None and isinstance(error, RuntimeError)


def test_a_failed_pass_drops_deliveries_that_were_only_queued():
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> Any:
        started.set()
        release.wait(10)
        ran.append("first")

    with pytest.raises(RuntimeError), _Deliveries(threads=1) as pool:
        pool.submit(batch(), first)
        for _ in range(3):
            pool.submit(batch(), returning("queued", record=ran))
        started.wait(10)
        threading.Timer(0.1, release.set).start()
        raise RuntimeError("the pass failed")
    assert ran == ["first"]
