"""What a void or a cancel gives back takes its money off the spend report too,
whether or not a spend limit of the charge's currency exists (SQLite and
PostgreSQL): the report bills what was consumed and not given back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.reports.spend import spend_report
from metering.upkeep.audit import run_audit

NOW = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=50, period="1h", window="calendar"))
        meter.set_limit(Limit("tokens", maximum=5_000, period="1h", window="calendar"))
        meter.set_limit(spend_limit("usd_cap", "5", "USD", "1mo", window="calendar"))
        meter.set_price("calls", "0.01", "EUR")  # no spend limit in EUR
        meter.set_price("tokens", "0.01", "USD")  # capped by usd_cap
        yield meter


def _billed(meter: Meter) -> dict[tuple[str, str], int]:
    """The spend report's amounts, by subject and limit (none: nothing billed)."""
    rows = spend_report(meter).rows
    return {(r.subject, limit): n for r in rows for limit, n in r.amounts.items() if n}


def test_a_void_takes_its_money_off_the_report_with_or_without_a_spend_limit(
    meter: Meter,
) -> None:
    meter.consume("org", "calls", 3, event_id="e-1")
    meter.consume("org", "tokens", 4, event_id="e-2")
    meter.consume("org", "calls", 2, event_id="e-3")
    assert _billed(meter) == {("org", "calls"): 5, ("org", "tokens"): 4}
    meter.void("e-1", "refund")
    meter.void("e-2", "refund")
    assert _billed(meter) == {("org", "calls"): 2}
    assert run_audit(meter, full=True).violations == ()


def test_a_cancel_takes_its_money_off_the_report_with_or_without_a_spend_limit(
    meter: Meter,
) -> None:
    uncapped = meter.reserve(charges=[("org", "calls", 3)], event_id="r-1")
    capped = meter.reserve(charges=[("org", "tokens", 4)], event_id="r-2")
    kept = meter.reserve(charges=[("org", "calls", 2)], event_id="r-3")
    assert _billed(meter) == {("org", "calls"): 5, ("org", "tokens"): 4}
    assert uncapped.cancel() == 3
    assert capped.cancel() == 4 + 4  # units and cents
    assert kept.commit() == 0
    assert _billed(meter) == {("org", "calls"): 2}
    assert run_audit(meter, full=True).violations == ()


def test_a_void_takes_its_money_off_though_its_limit_became_a_seat_limit(meter: Meter) -> None:
    """Its seat rules free no seat for an event decided before (it named no
    value then), so no unit goes back: its money goes all the same."""
    meter.consume("org", "calls", 3, event_id="e-1", metadata={"user": "ann"})
    meter.remove_price("calls", "EUR")
    meter.set_limit(Limit("calls", maximum=5, period="1h", window="calendar", distinct="user"))
    meter.void("e-1", "refund")
    assert _billed(meter) == {}
    rollups = [v for v in run_audit(meter, full=True).violations if v.invariant == "rollup_ledger"]
    assert rollups == []
