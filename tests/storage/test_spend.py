"""Spend limits with the rest of the ledger, on both databases: the hot paths
leave money to the reference engine (also when a price appears after a
process cached its limits), reservations, voids, soft caps, currencies."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.errors import InputRefused, InvalidInput
from metering.reports.spend import spend_report
from metering.storage.tables import counters

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=1000, period="1mo", window="calendar"))
        m.set_limit(spend_limit("spend", "0.50", "USD", "1mo", window="calendar"))
        yield m


def spent(meter: Meter, subject: str = "org-1", limit: str = "spend") -> int:
    return sum(c.used for c in meter.counters(subject, limit))


def reported(meter: Meter) -> dict[tuple[str, str], int]:
    rows = spend_report(meter, "2026-11").rows
    return {(r.subject, name): cents for r in rows for name, cents in r.amounts.items()}


def test_a_price_set_by_another_process_applies_to_the_next_event(
    meter: Meter, db_url: str
) -> None:
    assert meter.consume("org-1", "calls", 10).allowed  # the hot path caches the limits
    assert meter.check("org-1", "calls", 10).allowed
    with Meter(db_url, clock=FrozenClock(NOW)) as other:
        other.set_price("calls", "0.01", "USD")
    decision = meter.consume("org-1", "calls", 10)
    assert [c.limit for c in decision.charges] == ["calls", "spend"]
    assert (decision.charges[0].price, decision.charges[1].cost) == (("USD", 10), 10)
    checked = meter.check("org-1", "calls", 45)
    assert (checked.allowed, checked.denied_by) == (False, ("spend",))
    denied = meter.consume("org-1", "calls", 45)
    assert (denied.allowed, denied.denied_by) == (False, ("spend",))
    assert (spent(meter), meter.counters("org-1", "calls")[0].used) == (10, 20)
    assert reported(meter) == {("org-1", "calls"): 10}


def test_a_cancelled_reservation_gives_the_money_back_once(meter: Meter) -> None:
    meter.set_price("calls", "0.01", "USD")
    held = meter.reserve("org-1", "calls", 30)
    assert held.allowed and spent(meter) == 30
    assert reported(meter) == {("org-1", "calls"): 30}
    with pytest.raises(InvalidInput, match="commits at most the units it reserved"):
        meter.commit_reservation(held.id, actual=40)  # its money was held for 30
    assert spent(meter) == 30  # the refused settle changed nothing
    assert meter.counters("org-1", "calls")[0].used == 30
    assert meter.cancel_reservation(held.id) > 0
    assert meter.cancel_reservation(held.id) == 0
    assert spent(meter) == 0
    assert reported(meter) == {}
    kept = meter.reserve("org-1", "calls", 20)
    meter.commit_reservation(kept.id)
    assert (spent(meter), reported(meter)) == (20, {("org-1", "calls"): 20})


def test_a_void_gives_the_money_back_and_the_report_drops_it(meter: Meter) -> None:
    meter.set_price("calls", "0.005", "USD")
    first = meter.consume("org-1", "calls", 3, event_id="job-1")  # 1.5 cents: 2
    meter.consume("org-1", "calls", 1, event_id="job-2")  # 0.5 cent: 0, nothing charged
    assert [c.limit for c in meter.result("job-2").charges] == ["calls"]  # type: ignore[union-attr]
    assert first.charges[0].price == ("USD", 2)
    assert spent(meter) == 2
    meter.void("job-1", "refund")
    assert (spent(meter), reported(meter)) == (0, {})


def test_a_soft_cap_records_money_overage(meter: Meter) -> None:
    meter.set_limit(
        spend_limit("spend", "0.10", "USD", "1mo", window="calendar", enforcement="soft")
    )
    meter.set_price("calls", "0.01", "USD")
    decision = meter.consume("org-1", "calls", 15)
    assert decision.outcome == "overage"
    assert (decision.charges[1].used, decision.charges[1].overage) == (15, 5)


def test_a_soft_cap_summed_past_the_column_is_refused_on_both_databases(meter: Meter) -> None:
    """Each charge's amount is bounded, their sum in a soft cap's window is
    not: past the 64-bit column the database refuses the event, on SQLite
    as on PostgreSQL, and nothing of it is stored."""
    meter.set_limit(
        spend_limit("spend", "0.10", "USD", "1mo", window="calendar", enforcement="soft")
    )
    meter.set_price("calls", "10000000", "USD")
    meter.consume("org-1", "calls", 1, event_id="first")
    with meter.sql_engine.begin() as connection:
        connection.execute(
            update(counters).where(counters.c.limit_name == "spend").values(used=2**63 - 10)
        )
    with pytest.raises(InputRefused):
        meter.consume("org-1", "calls", 1, event_id="past")
    assert meter.result("past") is None
    assert (spent(meter), spent(meter, limit="calls")) == (2**63 - 10, 1)


def test_a_price_charges_only_spend_limits_of_its_currency(meter: Meter) -> None:
    meter.set_limit(Limit("tokens", maximum=10**6, period="1mo", window="calendar"))
    meter.set_limit(spend_limit("spend_eur", "1", "EUR", "1mo", window="calendar"))
    meter.set_price("tokens", "0.001", "EUR")
    meter.set_price("calls", "0.01", "USD")
    decision = meter.consume(charges=[("org-1", "calls", 2), ("org-1", "tokens", 30)])
    assert sorted((c.limit, c.cost) for c in decision.charges) == [
        ("calls", 2),
        ("spend", 2),
        ("spend_eur", 3),
        ("tokens", 30),
    ]
    rows = spend_report(meter, "2026-11").rows
    assert sorted((r.currency, r.total, r.spend_limit, r.cap) for r in rows) == [
        ("EUR", 3, "spend_eur", 100),
        ("USD", 2, "spend", 50),
    ]


def test_an_entitlement_is_a_customer_s_own_cap(meter: Meter) -> None:
    meter.set_price("calls", "0.01", "USD")
    meter.set_entitlement("org-1", "spend", 100)
    assert meter.consume("org-1", "calls", 80).allowed
    assert not meter.consume("org-2", "calls", 80).allowed
    [row] = [r for r in spend_report(meter, "2026-11").rows if r.subject == "org-1"]
    assert row.cap == 100


def test_a_price_effective_later_applies_from_then(meter: Meter) -> None:
    meter.set_price("calls", "0.01", "USD")
    meter.set_price("calls", "0.02", "USD", effective_from=datetime(2026, 11, 22, 13, tzinfo=UTC))
    assert meter.consume("org-1", "calls", 5).charges[0].price == ("USD", 5)
    later = datetime(2026, 11, 22, 12, 4, tzinfo=UTC)  # within the 5 minutes allowed ahead
    assert meter.consume("org-1", "calls", 5, occurred_at=later).charges[0].price == ("USD", 5)
    assert [p.per_unit for p in meter.prices("calls")] == [1_000_000, 2_000_000]


def test_a_priced_limit_is_never_leased(meter: Meter) -> None:
    """A hot key of a priced limit takes the exact path: each request is priced
    on its own (here a tenth of a cent, rounded to 0: no spend charge, one
    charge, which a lease would otherwise take in blocks)."""
    meter.set_price("calls", "0.001", "USD")
    for _ in range(40):
        decision = meter.lease("org-1", "calls", 1)
        assert [(c.limit, c.price) for c in decision.charges] == [("calls", ("USD", 0))]
    meter.settle_leases(everything=True)
    assert spent(meter) == 0
    assert meter.counters("org-1", "calls")[0].used == 40


def test_a_worker_batch_mixing_money_and_plain_events(meter: Meter) -> None:
    """The worker's batch: a priced event sends the batch to the reference
    engine, which decides every event as the fast path would; a charge naming
    a spend limit is rejected with its reason, and the rest apply."""
    meter.set_limit(Limit("plain", maximum=3, period="1h"))
    meter.set_price("calls", "0.01", "USD")
    events = [
        make_event([("org-1", "plain", 2)], NOW, "b-1"),
        make_event([("org-1", "calls", 30)], NOW, "b-2"),
        make_event([("org-1", "spend", 5)], NOW, "b-3"),
        make_event([("org-1", "calls", 30)], NOW, "b-4"),
        make_event([("org-1", "plain", 2)], NOW, "b-5"),
        make_event([("org-1", "calls", 30)], NOW, "b-2"),  # redelivered
    ]
    found = meter.apply(events)
    outcomes = [d.outcome for d in found]  # type: ignore[union-attr]
    assert outcomes == ["allowed", "allowed", "rejected", "denied", "denied", "allowed"]
    assert "spend limit" in (found[2].reason or "")  # type: ignore[union-attr]
    assert found[3].denied_by == ("spend",)  # type: ignore[union-attr]
    assert found[5].duplicate  # type: ignore[union-attr]
    assert spent(meter) == 30
