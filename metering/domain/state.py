"""The state of one counter and what one charge would do to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["allowed", "denied", "overage", "would_deny", "ahead_of_pace"]

# Token buckets have no windows: their single counter row uses this key.
NO_WINDOW = 0


@dataclass(frozen=True, slots=True)
class CounterKey:
    """Which counter a charge lands on: a subject's limit in one window."""

    limit: str
    subject: str
    window_start_us: int
    window_end_us: int


@dataclass(frozen=True, slots=True)
class CounterState:
    """A counter as stored.

    ``used`` is what the window consumed (a bucket: tokens taken, ever).
    A token bucket keeps its theoretical arrival time (GCRA) as the exact
    rational ``tat_us + tat_rem / tat_scale`` microseconds, where
    ``tat_scale`` is the bucket's capacity when it was written.
    """

    used: int = 0
    denied_count: int = 0
    denied_cost: int = 0
    first_denied_at_us: int | None = None
    tat_us: int | None = None
    tat_rem: int = 0
    tat_scale: int = 1

    def with_denial(self, cost: int, now_us: int) -> CounterState:
        first = self.first_denied_at_us if self.first_denied_at_us is not None else now_us
        # Built directly: `dataclasses.replace` costs several times as much,
        # and a backtest makes two states per charge (`metering.domain.replay`).
        return CounterState(
            self.used,
            self.denied_count + 1,
            self.denied_cost + cost,
            first,
            self.tat_us,
            self.tat_rem,
            self.tat_scale,
        )

    def with_used(self, used: int) -> CounterState:
        """This state with ``used`` consumed in the window."""
        return CounterState(
            used,
            self.denied_count,
            self.denied_cost,
            self.first_denied_at_us,
            self.tat_us,
            self.tat_rem,
            self.tat_scale,
        )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one charge would do: whether it fits, and the figures either way.

    ``applied`` is the state after consuming, ``denied`` the state after
    recording a denial. ``used``/``remaining`` are before (``*_before``) and
    after consuming (``*_after``).
    """

    fits: bool
    applied: CounterState
    denied: CounterState
    used_before: int
    used_after: int
    remaining_before: int
    remaining_after: int
    resets_at_us: int
    resets_at_before_us: int
    retry_at_us: int | None
    overage_after: int
    overage_before: int = 0
    # Grants that pay for the charge if it is consumed (see `grants.fit_window`).
    draws: tuple[tuple[str, int], ...] = ()
    # A soft paced charge past the pace, within the maximum (`metering.domain.pacing`).
    ahead_of_pace: bool = False
