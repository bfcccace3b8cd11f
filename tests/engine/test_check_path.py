"""`Meter.check` on the hot path's rules answers what the general engine answers.

On PostgreSQL `check` decides by `metering.domain.rules` over the state
read in one statement, outside any transaction (`metering.engine.fast.check_record`),
and leaves to the general engine (`Engine._check_reference`, what `check` ran
before) only what the hot path leaves to it. Hypothesis drives a stream of
batches (the streams of ``test_fast_path.py``: stacked charges, first-use
and calendar windows, token buckets, soft limits, denials, late, future and
unknown-limit events, a limit changed between batches, subjects' own
maximums, grants and a shadow limit); after each batch
every check of a set is asked both ways: the same `Decision`, or the same
error.
"""

from __future__ import annotations

import multiprocessing
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from decision_paths import check_reference, refusing
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import PostgresServer
from test_fast_path import (
    LIMITS,
    NAMES,
    SETTINGS,
    START,
    SUBJECTS,
    _allowances,
    _events,
    streams,
)

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import Decision
from metering.domain.events import make_event
from metering.errors import MeteringError

charge = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(NAMES), st.integers(1, 5))
checks = st.lists(
    st.fixed_dictionaries(
        {
            "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
            "offset_seconds": st.sampled_from([0, -30, -700, -1900, -4000, 3600 * 30, 600]),
        }
    ),
    min_size=1,
    max_size=6,
)


def _answer(ask: Any) -> Decision | tuple[str, str]:
    try:
        decision: Decision = ask()
        return decision
    except MeteringError as exc:
        return (type(exc).__name__, str(exc))


def _compare(meter: Meter, specs: list[dict[str, Any]]) -> None:
    now = meter.clock()
    for spec in specs:
        when = now + timedelta(seconds=spec["offset_seconds"])
        hot = _answer(partial(meter.check, charges=spec["charges"], occurred_at=when))
        event = make_event(spec["charges"], when, "check")
        general = _answer(partial(check_reference, meter._engine, event, meter.database.now_us()))
        assert hot == general, spec


@pytest.mark.postgres
@settings(SETTINGS, max_examples=30)
@given(stream=streams, specs=checks)
def test_check_matches_the_general_engine(
    postgres_server: PostgresServer,
    pg_template_url: str,
    stream: list[dict[str, object]],
    specs: list[dict[str, Any]],
) -> None:
    with postgres_server.copy_of(pg_template_url, "check") as url:
        clock = FrozenClock(START)
        with Meter(url, clock=clock) as meter:
            meter.set_limits(LIMITS)
            _compare(meter, specs)
            for number, spec in enumerate(stream):
                clock.advance(seconds=spec["advance_seconds"])  # type: ignore[arg-type]
                maximum = spec["new_cal_maximum"]
                if isinstance(maximum, int):
                    meter.set_limit(Limit("cal", maximum=maximum, period="1h", window="calendar"))
                _allowances(meter, spec, clock(), number)
                events = _events(spec, clock())
                meter.apply_records([e.record() for e in events], invalid="reject")
                _compare(meter, specs)


def test_an_ordinary_check_never_reaches_the_general_engine(pg_url: str) -> None:
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.consume(charges=[("org-1", "fu", 3), ("org-1", "cal", 2)])

        def refuse(*_args: object) -> None:
            raise AssertionError("the general engine ran")

        refusing(meter._engine, refuse, applies=False)
        decision = meter.check(
            charges=[("org-1", "fu", 1), ("org-1", "cal", 1), ("org-1", "bucket", 1)]
        )
        assert decision.allowed
        assert decision.event_id is None
        assert [c.used for c in decision.charges] == [4, 3, 1]
        assert meter.check("org-1", "fu", 2).denied_by == ("fu",)
        # Nothing was consumed.
        assert [c.used for c in meter.counters("org-1") if c.limit == "fu"] == [3]


def _tighten(url: str) -> None:
    with Meter(url, clock=FrozenClock(START)) as other:
        other.set_limit(Limit("cal", maximum=1, period="1h", window="calendar"))


def test_a_limit_changed_in_another_process_applies_to_the_next_check(pg_url: str) -> None:
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        assert meter.consume("org-1", "cal").allowed
        assert meter.check("org-1", "cal").allowed  # the limits are now cached here
        process = multiprocessing.get_context("fork").Process(target=_tighten, args=(pg_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        decision = meter.check("org-1", "cal")
        assert (decision.outcome, decision.maximum) == ("denied", 1)
