"""A reset clears usage, not billing. A cancel after a reset of some of a
reservation's counters takes what the reset dropped from the hold off the
reports too (its money and its usage by dimension; the counter that started
over is not touched), a void after it takes nothing twice, a commit of
fewer (or more) priced units than reserved is refused, and a commit of more
unpriced units records their real cost there; on both databases, the settle
started on the direct path or under SQLAlchemy."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import CorrectionRefused, InvalidInput
from metering.reports import usage_by_dimension
from metering.reports.spend import spend_report
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
PATHS = ["fast", "reference"]


def _meter(
    db_url: str, path: str, *, priced: bool = True, clock: FrozenClock | None = None
) -> Meter:
    meter = Meter(db_url, clock=clock or FrozenClock(NOW))
    meter.set_limits(
        [
            Limit("a", maximum=50, period="1h", window="calendar", dimensions=("route",)),
            Limit("b", maximum=50, period="1h", window="calendar"),
            spend_limit("usd", "10", "USD", "1mo", window="calendar"),
        ]
    )
    if priced:
        meter.set_price("a", "0.01", "USD")
    if path == "reference":  # settled under SQLAlchemy
        meter._engine.settle = lambda direct, general: general()  # type: ignore[method-assign]
    return meter


def _billed(meter: Meter) -> dict[str, int]:
    return {k: n for row in spend_report(meter).rows for k, n in row.amounts.items() if n}


def _routes(meter: Meter) -> dict[str | None, tuple[int, int]]:
    rows = usage_by_dimension(meter, subject="org", key="route").rows()
    return {r.value: (r.used, r.events) for r in rows if r.used or r.events}


def _used(meter: Meter) -> dict[str, int]:
    return {c.limit: c.used for c in meter.counters("org")}


def _audited(meter: Meter) -> None:
    assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize("path", PATHS)
def test_a_cancel_after_a_reset_bills_nothing_it_held(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        charges = [("org", "a", 3), ("org", "b", 2)]
        held = meter.reserve(charges=charges, event_id="r-1", metadata={"route": "/x"})
        assert _billed(meter) == {"a": 3}
        meter.reset("org", "a")  # support: the counter of a starts over
        assert held.cancel() == 2 + 3  # b's units and usd's cents (a's counter started over)
        assert _used(meter)["b"] == 0  # (the reset deleted a's counter)
        assert _billed(meter) == {}
        assert _routes(meter) == {}
        _audited(meter)
        with pytest.raises(CorrectionRefused):
            meter.void("r-1", "refund")  # nothing is left to take twice
        assert _billed(meter) == {}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_cancel_after_a_reset_of_every_counter_bills_nothing(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve("org", "a", 4, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org")  # every counter of the subject: the hold is all gone
        assert held.cancel() == 0
        assert _billed(meter) == {}
        assert _routes(meter) == {}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reset", [False, True])
def test_a_cancel_after_the_window_ended_gives_nothing_back_reset_or_not(
    db_url: str, path: str, reset: bool
) -> None:
    """Past its window a cancel gives nothing back, its money included, whether
    or not a reset dropped the charge from the hold; a void still can."""
    clock = FrozenClock(NOW)
    with _meter(db_url, path, clock=clock) as meter:
        held = meter.reserve(
            "org", "a", 4, event_id="r-1", metadata={"route": "/x"}, ttl_seconds=7200
        )
        if reset:
            meter.reset("org", "a")
        clock.set(datetime(2026, 11, 30, 23, 5, tzinfo=UTC))  # a's hour is over
        assert held.cancel() == 0
        assert _billed(meter) == {"a": 4}
        assert _used(meter)["usd"] == 4  # the cap counts what is billed
        assert _routes(meter) == {"/x": (4, 1)}
        _audited(meter)
        meter.void("r-1", "refund")
        assert _billed(meter) == {}
        assert _used(meter)["usd"] == 0
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("actual", "refusal"),
    [
        (1, "a reset cleared 'a' since it was reserved"),
        (5, "commits at most the units it reserved"),
    ],
)
def test_a_commit_of_other_priced_units_after_a_reset_is_refused(
    db_url: str, path: str, actual: int, refusal: str
) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve("org", "a", 3, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org", "a")
        with pytest.raises(InvalidInput, match=refusal):
            held.commit(actual=actual)
        assert meter.reservation("r-1").state == "held"
        assert held.commit() == 0  # in full: what was held stays billed
        assert _billed(meter) == {"a": 3}
        assert _routes(meter) == {"/x": (3, 1)}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_that_keeps_every_held_unit_is_refused_when_a_reset_dropped_more(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        charges = [("org", "a", 3), ("org", "b", 2)]
        held = meter.reserve(charges=charges, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org", "a")  # a's 3 priced units leave the hold; b's 2 stay
        with pytest.raises(InvalidInput, match="a reset cleared 'a' since it was reserved"):
            held.commit(actual=2)  # b keeps all it holds; a's money cannot be split
        assert meter.reservation("r-1").state == "held"
        assert _billed(meter) == {"a": 3}
        assert held.commit() == 0
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_fewer_units_after_a_reset_takes_the_rest_off_the_usage_report(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path, priced=False) as meter:
        charges = [("org", "a", 3), ("org", "b", 3)]
        held = meter.reserve(charges=charges, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org", "a")
        assert held.commit(actual=1) == 2  # b's 2 units (a's counter started over)
        assert _used(meter)["b"] == 1
        assert _routes(meter) == {"/x": (1, 1)}  # a kept 1 unit of its 3
        _audited(meter)
        assert meter.void("r-1", "refund") is not None
        assert _routes(meter) == {}
        assert _used(meter)["b"] == 0
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_less_after_a_reset_of_the_spend_limit_is_refused(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve("org", "a", 3, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org", "usd")  # the spend counter starts over: its 3 cents leave the hold
        with pytest.raises(InvalidInput, match="a reset cleared 'usd' since it was reserved"):
            held.commit(actual=1)
        assert meter.reservation("r-1").state == "held"
        assert held.commit(actual=3) == 0  # every unit kept: nothing to split
        assert _billed(meter) == {"a": 3}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_more_after_a_reset_records_the_real_cost(db_url: str, path: str) -> None:
    with _meter(db_url, path, priced=False) as meter:
        charges = [("org", "a", 1), ("org", "b", 1)]
        held = meter.reserve(charges=charges, event_id="r-1", metadata={"route": "/x"})
        meter.reset("org", "a")  # a's counter starts over: its unit leaves the hold
        assert held.commit(actual=3) == 0
        # Billing keeps the real cost; the counter that started over takes none of it.
        assert [c.cost for c in meter.result("r-1").charges] == [3, 3]
        assert _routes(meter) == {"/x": (3, 1)}
        assert _used(meter) == {"b": 3}
        _audited(meter)
        assert meter.void("r-1", "refund") is not None
        assert _routes(meter) == {}
        assert _used(meter)["b"] == 0
        _audited(meter)
