"""The chaos suite's verdict on rows that take long: late while they keep arriving past the
deadline, lost only when they are still not final at three times it (chaos/verdicts.py)."""

from chaos.verdicts import DrainClock


def clock() -> DrainClock:
    return DrainClock(started=0.0, timeout=100.0, grace=20.0, factor=3)


def test_rows_all_final_before_the_deadline_are_neither_late_nor_lost():
    wait = clock()
    assert wait.observe(now=10, moving={"a", "b"}) is None
    assert wait.observe(now=50, moving=set()) == "drained"
    assert wait.late is None


def test_the_deadline_follows_progress_so_rows_still_arriving_are_not_late():
    wait = clock()
    wait.observe(now=90, moving={"a", "b", "c"})
    wait.observe(now=95, moving={"a", "b"})  # one arrived: the deadline moves to 115
    assert wait.observe(now=110, moving={"a", "b"}) is None and wait.late is None
    assert wait.observe(now=112, moving=set()) == "drained"
    assert wait.late is None


def test_rows_still_moving_when_the_deadline_passes_are_late_and_may_arrive_until_three_times_it():
    wait = clock()
    wait.observe(now=50, moving={"a", "b"})
    assert wait.observe(now=101, moving={"a", "b"}) is None
    assert wait.late == {"a", "b"}
    assert wait.observe(now=250, moving={"b"}) is None  # late, but arriving
    assert wait.observe(now=280, moving=set()) == "drained"
    assert wait.late == {"a", "b"}


def test_a_row_that_never_arrives_is_stuck_at_three_times_the_deadline():
    wait = clock()
    wait.observe(now=50, moving={"a", "b"})
    wait.observe(now=120, moving={"a"})
    assert wait.observe(now=299, moving={"a"}) is None
    assert wait.observe(now=300, moving={"a"}) == "stuck"


def test_progress_never_moves_the_deadline_beyond_three_times_it():
    wait = clock()
    wait.observe(now=10, moving={"a", "b", "c"})
    wait.observe(now=295, moving={"a", "b"})
    assert wait.deadline == 300 and wait.hard == 300
