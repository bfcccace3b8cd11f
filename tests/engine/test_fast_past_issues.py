"""The fast path reads only the grants a batch can draw on, and decides as the reference engine.

Its reads leave out grants used up and those expired before the batch's
earliest event (`metering.storage.hot.HotStore.read`'s ``grants_since_us``):
a recurring grant's past issues, a used-up top-up. Here two databases are fed
the same events on the same frozen clock, month after month: one decided by
the fast path alone (the reference engine refuses), one by the reference
engine alone; answers, checks, grants (``used``, what is left) and every
table a decision writes must be equal, with late events drawing on an issue
expired since, a used-up grant beside a live one, a pair whose grants are
all used up or expired in a window they paid in, and rollover into new issues.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from decision_paths import refusing
from differential import answer, databases, stored

from metering import FrozenClock, Limit, Meter, make_event

CALLS = Limit("calls", maximum=2, period="1mo", window="calendar", lateness="40d")
SOFT = Limit("soft", maximum=2, period="1mo", window="calendar", lateness="40d", enforcement="soft")
START = datetime(2026, 8, 20, 12, tzinfo=UTC)
# The months after the first, each a few days in: the previous month's last
# day is within the limits' lateness.
MONTHS = [datetime(2026, month, 3, 9, tzinfo=UTC) for month in (9, 10, 11, 12)]
KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _refuse(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("the reference engine decided")


@contextmanager
def _meters(
    request: pytest.FixtureRequest, kind: str
) -> Iterator[tuple[FrozenClock, Meter, Meter]]:
    """A meter deciding on the fast path alone and one on the reference engine
    alone, on databases of ``kind``, with the same grants, on one clock."""
    clock = FrozenClock(START)
    with databases(request, kind, 2) as urls:
        fast, reference = Meter(urls[0], clock=clock), Meter(urls[1], clock=clock)
        with fast, reference:
            for meter in (fast, reference):
                meter.set_limits([CALLS, SOFT])
                # a: a recurring grant rolling over, a top-up drawn first (used
                # up soon) and a big one drawn last; b: a recurring grant on a
                # soft limit, used up every month (its own usage is what the
                # window's counter has less what grants paid).
                meter.grant("a", "calls", 10, every="1mo", rollover_max=3, grant_id="m-a", low=2)
                expires = datetime(2027, 6, 1, tzinfo=UTC)
                meter.grant("a", "calls", 3, expires, grant_id="top-a", priority=1)
                meter.grant("a", "calls", 1000, grant_id="live-a", priority=500)
                meter.grant("b", "soft", 4, every="1mo", grant_id="m-b")
            refusing(fast._engine, _refuse)
            reference._engine.paths = [p for p in reference._engine.paths if p.name == "reference"]
            yield clock, fast, reference


def _same(fast: Meter, reference: Meter, ask: Any) -> Any:
    """``ask`` of each meter: the same answer from both."""
    found = answer(lambda: ask(fast))
    assert found == answer(lambda: ask(reference))
    return found


def _batch(at: datetime, tag: str, late: datetime | None) -> list[Any]:
    """Charges of a and b at ``at`` (and one of each at ``late``, amid them)."""
    events = [
        make_event([("a", "calls", 3)], at, f"{tag}-a1"),
        make_event([("b", "soft", 3)], at, f"{tag}-b1"),
        make_event([("a", "calls", 4)], at + timedelta(minutes=1), f"{tag}-a2"),
    ]
    if late is not None:
        events += [
            make_event([("a", "calls", 2)], late, f"{tag}-a-late"),
            make_event([("b", "soft", 2)], late, f"{tag}-b-late"),
        ]
    events += [
        make_event([("a", "calls", 6)], at + timedelta(minutes=2), f"{tag}-a3"),
        make_event([("b", "soft", 3)], at + timedelta(minutes=2), f"{tag}-b2"),
    ]
    return events


def _grants(meter: Meter) -> list[tuple[str, int, int, int]]:
    return [(g.grant_id, g.amount, g.used, g.left) for g in meter.grants()]


def _apply(meter: Meter, events: list[Any]) -> list[Any]:
    return list(meter.apply(events))


@pytest.mark.parametrize("kind", KINDS)
def test_months_of_issues_are_decided_as_the_reference_engine(
    request: pytest.FixtureRequest, kind: str
) -> None:
    with _meters(request, kind) as (clock, fast, reference):
        _same(fast, reference, lambda m: _apply(m, _batch(START, "aug", None)))
        for number, month in enumerate(MONTHS):
            clock.set(month)
            tag = f"m{number}"
            # The new issue is made by the batch; the one before expired.
            _same(fast, reference, lambda m, at=month, t=tag: _apply(m, _batch(at, t, None)))
            # Again in the same month: the issue and the top-up are used up by
            # now (b's window drew on grants none of which is left).
            again = month + timedelta(hours=1)
            clock.set(again)
            found = _same(
                fast, reference, lambda m, at=again, t=tag: _apply(m, _batch(at, t + "x", None))
            )
            assert [d.outcome for d in found] == [
                "allowed",
                "overage",
                "allowed",
                "allowed",
                "overage",
            ]
            _same(fast, reference, lambda m: m.check("a", "calls", 5))
            _same(fast, reference, lambda m: m.check("b", "soft", 5))
            _same(fast, reference, lambda m, t=tag: m.consume("a", "calls", 2, event_id=t + "-one"))
            assert _grants(fast) == _grants(reference)
        # One issue a month, each with what rolled over from the one before.
        issues = [g for g in _grants(fast) if g[0].startswith("m-a")]
        assert len(issues) == 1 + len(MONTHS)
        assert [amount for _, amount, _, _ in issues] == [10, 12, 10, 10, 10]  # 2 rolled over
        assert ("top-a", 3, 3, 0) in _grants(fast)  # used up, beside "live-a"
        assert stored(fast) == stored(reference)


@pytest.mark.parametrize("kind", KINDS)
def test_late_events_draw_on_an_issue_expired_since(
    request: pytest.FixtureRequest, kind: str
) -> None:
    with _meters(request, kind) as (clock, fast, reference):
        # August's issues are barely drawn on: what is left rolls over (a) and
        # pays late events of August once September has begun.
        _same(fast, reference, lambda m: m.consume("a", "calls", 2, event_id="aug-own"))
        _same(fast, reference, lambda m: m.consume("b", "soft", 3, event_id="aug-b"))
        clock.set(MONTHS[0])
        late = datetime(2026, 8, 31, 23, tzinfo=UTC)
        # The batch's first event is September's; August's amid it draw on
        # August's issues (expired now) and roll nothing more into September's.
        found = _same(fast, reference, lambda m: _apply(m, _batch(MONTHS[0], "sep", late)))
        by_id = {d.event_id: d for d in found}
        # (September's events before it used the top-up up: August's issue pays.)
        assert by_id["sep-a-late"].charges[0].grants == (("m-a", 2),)
        assert by_id["sep-b-late"].charges[0].grants == (("m-b", 2),)
        # (A charge of now lets the cache learn b's next issue: a check with
        # one due is left to the reference engine.)
        _same(fast, reference, lambda m: m.consume("b", "soft", 1, event_id="sep-b-now"))
        # A check, and one event alone, of August: its issue's last unit.
        late_one = late + timedelta(minutes=30)
        checked = _same(fast, reference, lambda m: m.check("b", "soft", 1, occurred_at=late_one))
        assert checked.allowed and checked.charges[0].grants == (("m-b", 1),)
        one = _same(
            fast,
            reference,
            lambda m: m.consume("b", "soft", 1, occurred_at=late_one, event_id="late-one"),
        )
        assert one.charges[0].grants == (("m-b", 1),)
        assert _grants(fast) == _grants(reference)
        assert ("m-b", 4, 4, 0) in _grants(fast)  # 1 in August, 2 + 1 late
        assert stored(fast) == stored(reference)
