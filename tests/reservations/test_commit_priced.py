"""A commit of priced usage at ``actual`` units: its money follows the units.

``actual`` is the reservation's units; its spend charges keep the money of
the first ``actual`` units reserved, at the price the reserve charged, and
the rest of units and money goes back once, on both databases, whether the
settle starts on the direct path or under SQLAlchemy (the reference). The
result, the spend report and the audit agree with the counters.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import CorrectionRefused, InvalidInput
from metering.reports.overage import overage_report
from metering.reports.spend import spend_report
from metering.storage.tables import counters, reservations
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
PATHS = ["fast", "reference"]


def _meter(db_url: str, path: str, clock: FrozenClock | None = None) -> Meter:
    meter = Meter(db_url, clock=clock or FrozenClock(NOW))
    meter.set_limits(
        [
            Limit("calls", maximum=100, period="1h", window="calendar"),
            Limit("tokens", maximum=1_000, period="1h", window="calendar"),
            Limit("plain", maximum=100, period="1h", window="calendar"),
            spend_limit("usd_cap", "5", "USD", "1h", window="calendar"),
        ]
    )
    meter.set_price("calls", "0.02", "USD", effective_from=NOW - timedelta(days=1))
    meter.set_price(
        "tokens",
        None,
        "USD",
        model="graduated",
        tiers=["5:0.02", "inf:0.01"],
        flat_fee="0.50",
        effective_from=NOW - timedelta(days=1),
    )
    if path == "reference":  # settled under SQLAlchemy, decided by the reference engine
        meter._engine.settle = lambda direct, general: general()  # type: ignore[method-assign]
        meter._engine.paths = [meter._engine.path("reference")]
    return meter


def _used(meter: Meter, subject: str = "org") -> dict[str, int]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(counters.c.limit_name, counters.c.used).where(counters.c.subject == subject)
        )
        return {limit: used for limit, used in rows}


def _given_back(meter: Meter, reservation_id: str) -> object:
    with meter.sql_engine.connect() as connection:
        return connection.execute(
            select(reservations.c.given_back).where(reservations.c.id == reservation_id)
        ).scalar_one()


def _spent(meter: Meter) -> dict[str, int]:
    """The spend report's amounts of org (no row: nothing spent)."""
    rows = spend_report(meter, subject="org").rows
    return {limit: amount for row in rows for limit, amount in row.amounts.items() if amount}


def _audited(meter: Meter) -> None:
    assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_at_the_reserved_units_commits_in_full_at_any_price(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert held.decision.charges[1].cost == 6  # 3 units at 2 cents
        assert held.commit(actual=3) == 0
        assert meter.reservation("r-1").state == "committed"
        assert _used(meter) == {"calls": 3, "usd_cap": 6}
        assert _spent(meter) == {"calls": 6}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_fewer_units_keeps_their_money_and_gives_the_rest_back(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert held.commit(actual=1) == 2 + 4  # 2 units and 4 cents
        assert held.commit(actual=1) == 0  # once
        assert _used(meter) == {"calls": 1, "usd_cap": 2}
        assert _spent(meter) == {"calls": 2}
        result = meter.result("r-1")
        assert result is not None
        assert [(c.limit, c.cost, c.price) for c in result.charges] == [
            ("calls", 3, ("USD", 2)),  # the units reserved; the money kept
            ("usd_cap", 2, None),
        ]
        assert "calls" in str(_given_back(meter, "r-1"))
        assert "usd_cap" not in str(_given_back(meter, "r-1"))
        _audited(meter)
        meter.void("r-1", "refund")  # the rest: 1 unit, 2 cents
        assert _used(meter) == {"calls": 0, "usd_cap": 0}
        assert _spent(meter) == {}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_no_units_gives_all_the_money_back(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert held.commit(actual=0) == 3 + 6
        assert _used(meter) == {"calls": 0, "usd_cap": 0}
        assert _spent(meter) == {}
        _audited(meter)
        with pytest.raises(CorrectionRefused):
            meter.void("r-1", "refund")


@pytest.mark.parametrize("path", PATHS)
def test_graduated_units_kept_are_the_first_reserved_with_the_flat_fee(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        first = meter.consume("org", "tokens", 3)  # the fee and 3 at 2 cents
        assert first.charges[0].price == ("USD", 56)
        held = meter.reserve(charges=[("org", "tokens", 4)], event_id="r-1")
        assert held.decision.charges[0].price == ("USD", 6)  # units 4-5 at 2, 6-7 at 1
        later = meter.consume("org", "tokens", 2)  # units 8-9 at 1 cent
        assert held.commit(actual=3) == 1 + 1  # unit 7 and its cent
        assert _used(meter) == {"tokens": 8, "usd_cap": 56 + 5 + 2}
        assert later.charges[0].price == ("USD", 2)
        assert _spent(meter) == {"tokens": 63}
        _audited(meter)
        opening = meter.reserve(charges=[("new", "tokens", 2)], event_id="r-2")
        assert opening.decision.charges[0].price == ("USD", 54)  # the fee with its units
        assert opening.commit(actual=1) == 1 + 2  # the fee stays with the unit kept
        assert _used(meter, "new") == {"tokens": 1, "usd_cap": 52}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_mixed_charges_keep_each_units_money(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        charges = [("org", "calls", 4), ("org", "plain", 3), ("org", "tokens", 2)]
        held = meter.reserve(charges=charges, event_id="r-1")
        assert [c.cost for c in held.decision.charges] == [4, 3, 2, 8 + 54]
        assert held.commit(actual=2) == 2 + 1 + 4  # 2 calls, 1 plain, 4 cents; tokens stay
        assert _used(meter) == {"calls": 2, "plain": 2, "tokens": 2, "usd_cap": 4 + 54}
        assert _spent(meter) == {"calls": 4, "tokens": 54}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_a_commit_of_more_priced_units_than_reserved_is_refused(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        with pytest.raises(InvalidInput, match="at most the units it reserved"):
            held.commit(actual=4)
        assert meter.reservation("r-1").state == "held"
        assert _used(meter) == {"calls": 3, "usd_cap": 6}
        assert held.commit(actual=3) == 0


@pytest.mark.parametrize("path", PATHS)
def test_a_price_changed_at_its_time_since_it_was_reserved_is_refused(
    db_url: str, path: str
) -> None:
    with _meter(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        meter.set_price("calls", "0.03", "USD", effective_from=NOW - timedelta(hours=1))
        with pytest.raises(InvalidInput, match="price changed since it was reserved"):
            held.commit(actual=1)
        assert _used(meter) == {"calls": 3, "usd_cap": 6}
        assert held.commit() == 0  # in full, as reserved
        _audited(meter)


def test_an_incremental_audit_follows_a_commit_of_fewer_priced_units(db_url: str) -> None:
    clock = FrozenClock(NOW)
    with _meter(db_url, "fast", clock) as meter:
        held = meter.reserve(charges=[("org", "calls", 5)], event_id="r-1", ttl_seconds=3600)
        clock.advance(seconds=120)
        assert run_audit(meter).violations == ()  # it keeps the result's 10 cents
        assert held.commit(actual=2) == 3 + 6
        meter.consume("org", "calls", 1)  # the spend window is judged again
        clock.advance(seconds=120)
        assert run_audit(meter).violations == ()
        assert run_audit(meter, full=True).violations == ()


@pytest.mark.parametrize("path", PATHS)
def test_the_overage_report_shows_the_money_committed(db_url: str, path: str) -> None:
    with _meter(db_url, path) as meter:
        meter.set_limit(
            spend_limit("usd_cap", "0.05", "USD", "1h", enforcement="soft", window="calendar")
        )
        held = meter.reserve(charges=[("org", "calls", 4)], event_id="r-1")
        assert held.decision.charges[1].overage == 3  # 8 cents of a 5-cent cap
        assert held.commit(actual=3) == 1 + 2
        [row] = overage_report(meter, limit="usd_cap")
        assert (row.used, row.overage) == (6, 1)
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_an_overdraft_beside_priced_units_bills_no_money(db_url: str, path: str) -> None:
    """Only unpriced usage can go past a hard limit at a commit: the spend
    report and the spend cap keep the money of the priced units reserved, and
    the overdraft is billed in units, by the overage report alone."""
    with _meter(db_url, path) as meter:
        meter.consume("org", "plain", 97)
        held = meter.reserve(charges=[("org", "calls", 5), ("org", "plain", 2)], event_id="r-1")
        assert held.commit(actual=5) == 0  # calls as reserved; plain 3 more, 2 past its 100
        assert _used(meter) == {"calls": 5, "plain": 102, "usd_cap": 10}
        assert _spent(meter) == {"calls": 10}
        billed = {row.limit: (row.used, row.overdraft) for row in overage_report(meter)}
        assert billed == {"calls": (5, 0), "plain": (102, 2), "usd_cap": (10, 0)}
        _audited(meter)


# -- priced usage with no spend limit of its currency ---------------------------------
# Its money is only in its result and the spend report: it follows the units all the same.


def _uncapped(db_url: str, path: str) -> Meter:
    meter = _meter(db_url, path)
    meter.delete_limit("usd_cap")
    return meter


@pytest.mark.parametrize("path", PATHS)
def test_with_no_spend_limit_a_commit_of_fewer_units_bills_the_units_kept(
    db_url: str, path: str
) -> None:
    with _uncapped(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert held.decision.charges[0].price == ("USD", 6)
        assert held.commit(actual=1) == 2
        assert _used(meter) == {"calls": 1}
        assert _spent(meter) == {"calls": 2}
        result = meter.result("r-1")
        assert result is not None
        assert [(c.limit, c.cost, c.price) for c in result.charges] == [("calls", 3, ("USD", 2))]
        _audited(meter)
        meter.void("r-1", "refund")
        assert _used(meter) == {"calls": 0}
        assert _spent(meter) == {}
        opening = meter.reserve(charges=[("new", "tokens", 2)], event_id="r-2")
        assert opening.decision.charges[0].price == ("USD", 54)  # the fee with its units
        assert opening.commit(actual=1) == 1
        assert _spent(meter) == {}  # (org's)
        assert spend_report(meter, subject="new").rows[0].amounts == {"tokens": 52}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_with_no_spend_limit_a_commit_of_no_units_bills_nothing(db_url: str, path: str) -> None:
    with _uncapped(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        assert held.commit(actual=0) == 3
        assert _used(meter) == {"calls": 0}
        assert _spent(meter) == {}
        _audited(meter)


@pytest.mark.parametrize("path", PATHS)
def test_with_no_spend_limit_a_commit_of_more_priced_units_is_refused(
    db_url: str, path: str
) -> None:
    with _uncapped(db_url, path) as meter:
        held = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
        with pytest.raises(InvalidInput, match="at most the units it reserved"):
            held.commit(actual=4)
        assert meter.reservation("r-1").state == "held"
        assert _used(meter) == {"calls": 3}
        assert _spent(meter) == {"calls": 6}
        plain = meter.reserve(charges=[("org", "plain", 3)], event_id="r-2")
        assert plain.commit(actual=4) == 0  # unpriced usage: the excess is charged
        assert _used(meter)["plain"] == 4
