"""Late events on a first-use limit, on every path that decides them.

The fast path and the one-trip function leave an event older than its
subject's current first-use window to the reference engine
(`metering.engine.reference.WindowResolver`); these tests send such an event
through each way in (``consume``, ``aconsume``, a worker's batch, a batch
that also opens the next window, ``check``), on SQLite and PostgreSQL. A late
event in the gap between two windows is charged to the window after it: no
gap holds a maximum of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import Decision
from metering.domain.events import make_event

MARCH = datetime(2027, 3, 1, tzinfo=UTC)
GAP = datetime(2027, 4, 1, tzinfo=UTC)  # March's window ends here
APRIL = datetime(2027, 4, 1, 0, 0, 1, tzinfo=UTC)  # the next window opens here
MAY = datetime(2027, 5, 1, 0, 0, 1, tzinfo=UTC)
Late = Callable[[Meter, int], Decision]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(MARCH)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("quota", maximum=2, period="1mo", lateness="40d"))
        yield m


def _opened(meter: Meter, clock: FrozenClock) -> None:
    """A window Mar 1 -> Apr 1, then one from Apr 1 00:00:01, one unit used."""
    assert meter.consume("org-1", "quota", event_id="march").allowed
    clock.set(APRIL)
    assert meter.consume("org-1", "quota", event_id="april").allowed


def _consume(meter: Meter, cost: int) -> Decision:
    return meter.consume("org-1", "quota", cost, occurred_at=GAP)


def _aconsume(meter: Meter, cost: int) -> Decision:
    return asyncio.run(meter.aconsume("org-1", "quota", cost, occurred_at=GAP))


def _batch(meter: Meter, cost: int) -> Decision:
    [applied] = meter.apply([make_event([("org-1", "quota", cost)], GAP)])
    assert isinstance(applied, Decision)
    return applied


PATHS = {"consume": _consume, "aconsume": _aconsume, "batch": _batch}


@pytest.mark.parametrize("late", PATHS.values(), ids=PATHS.keys())
def test_a_late_event_in_a_gap_is_charged_to_the_next_window(
    meter: Meter, clock: FrozenClock, late: Late
) -> None:
    _opened(meter, clock)
    refused = late(meter, 2)
    assert refused.outcome == "denied"
    assert (refused.used, refused.resets_at) == (1, MAY)
    fitting = late(meter, 1)
    assert fitting.allowed and (fitting.used, fitting.resets_at) == (2, MAY)
    assert late(meter, 1).outcome == "denied"
    windows = [(c.window_start, c.window_end, c.used) for c in meter.counters("org-1", "quota")]
    assert windows == [(MARCH, GAP, 1), (APRIL, MAY, 2)]


def test_a_late_event_in_a_batch_that_opens_the_next_window_is_charged_to_it(
    meter: Meter, clock: FrozenClock
) -> None:
    assert meter.consume("org-1", "quota", event_id="march").allowed
    clock.set(APRIL)
    opening = make_event([("org-1", "quota", 1)], APRIL, "april")
    late = make_event([("org-1", "quota", 2)], GAP, "late")
    applied = meter.apply([opening, late])
    assert [a.outcome for a in applied if isinstance(a, Decision)] == ["allowed", "denied"]
    windows = [(c.window_start, c.window_end, c.used) for c in meter.counters("org-1", "quota")]
    assert windows == [(MARCH, GAP, 1), (APRIL, MAY, 1)]


def test_a_check_of_a_late_event_in_a_gap_meets_the_next_window(
    meter: Meter, clock: FrozenClock
) -> None:
    _opened(meter, clock)
    assert meter.check("org-1", "quota", 2, occurred_at=GAP).outcome == "denied"
    fitting = meter.check("org-1", "quota", 1, occurred_at=GAP)
    assert fitting.allowed and (fitting.used, fitting.resets_at) == (2, MAY)


def test_a_late_event_before_every_window_opens_a_full_one_only_if_it_fits(
    meter: Meter, clock: FrozenClock
) -> None:
    clock.set(APRIL)
    assert meter.consume("org-1", "quota", 2, event_id="april").allowed
    # Mar 31 + 1 month overlaps April's window: charged there, and denied.
    assert _at(meter, datetime(2027, 3, 31, tzinfo=UTC)).outcome == "denied"
    # Mar 1 + 1 month ends before it: a window of its own, a whole period.
    assert _at(meter, MARCH).allowed
    windows = [(c.window_start, c.window_end, c.used) for c in meter.counters("org-1", "quota")]
    assert windows == [(MARCH, GAP, 2), (APRIL, MAY, 2)]


def _at(meter: Meter, occurred_at: datetime) -> Decision:
    return meter.consume("org-1", "quota", 2, occurred_at=occurred_at)
