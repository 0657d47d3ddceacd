"""When a chaos scenario's rows count as late, and when as lost (no Django: unit-tested alone).

A scenario waits for its rows to reach their final state. Its deadline follows its progress:
each time more rows have arrived, it moves to at least ``grace`` seconds later, so a loaded
machine that delivers slowly is not mistaken for one that loses rows. Rows still moving when
the deadline passes are *late*; the wait goes on for them until ``factor`` × the original
deadline, and rows still not final then are *stuck*: they count as lost, because a row that can
never arrive must fail the scenario.
"""

from dataclasses import dataclass, field


@dataclass
class DrainClock:
    """The deadline of one wait, started at ``started`` (monotonic seconds)."""

    started: float
    timeout: float
    grace: float = 20.0
    factor: int = 3
    late: set[str] | None = None  # the rows still moving when the deadline passed (None: not yet)
    deadline: float = field(init=False)
    _moving: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.deadline = self.started + self.timeout

    @property
    def hard(self) -> float:
        """When the wait ends whatever happens: ``factor`` × the deadline."""
        return self.started + self.factor * self.timeout

    def observe(self, *, now: float, moving: set[str]) -> str | None:
        """Take in the rows still moving at ``now``: "drained" when none is, "stuck" at the hard
        end, else None (wait on). Before the deadline passes, progress (fewer rows moving than
        at the last look) moves it to at least ``now + grace``."""
        if not moving:
            return "drained"
        if self.late is None and self._moving is not None and len(moving) < self._moving:
            self.deadline = min(self.hard, max(self.deadline, now + self.grace))
        self._moving = len(moving)
        if self.late is None and now >= self.deadline:
            self.late = set(moving)
        return "stuck" if now >= self.hard else None
