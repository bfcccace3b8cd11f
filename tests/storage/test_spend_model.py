"""A model of spend in money: effective-dated prices, a hard spend cap, voids.

Hypothesis draws random sequences of consume (one or two priced limits in
one event, some late, into the previous hour), price change (some effective
in the past or the future, some ending the price), void and clock advance.
A plain-Python model, written from docs/money.md and not from the code,
predicts every decision with `decimal` arithmetic (half to even at the
cent, per charge): the event is allowed iff the calls limit fits and the
sum of its charges' rounded amounts fits the subject's daily spend cap;
``denied_by`` names what did not fit. After every step the stored spend
counters equal the model's, `check` agreed with the decision before it,
and the spend report equals the allowed, unvoided amounts per limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.instants import to_us
from metering.reports.spend import spend_report

START = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)
HOUR_US = 3600 * 1_000_000
DAY_US = 24 * HOUR_US
CALLS_MAX = 40
CAP_CENTS = 30
LIMITS = [
    Limit("calls", maximum=CALLS_MAX, period="1h", window="calendar", lateness="2h"),
    Limit("tokens", maximum=100, period="1d", window="calendar", enforcement="soft", lateness="2h"),
    Limit("free", maximum=1000, period="1d", window="calendar", lateness="2h"),
    spend_limit("spend", "0.30", "USD", "1d", window="calendar", lateness="2h"),
]
PRICES = ["0.002", "0.0015", "0.005", "0.01", "0.00001", "0.125", None]
SUBJECTS = ["s1", "s2"]

consume = st.tuples(
    st.just("consume"),
    st.sampled_from(SUBJECTS),
    st.tuples(st.integers(1, 6), st.integers(0, 25), st.booleans()),
    st.sampled_from([0, 0, -1800]),
)
operation = st.one_of(
    consume,
    consume,
    consume,
    st.tuples(
        st.just("price"),
        st.sampled_from(["calls", "tokens"]),
        st.sampled_from(PRICES),
        st.sampled_from([0, -900, 600]),
    ),
    st.tuples(st.just("void"), st.integers(0, 50), st.just(0), st.just(0)),
    st.tuples(st.just("advance"), st.sampled_from([60, 900, 2400]), st.just(0), st.just(0)),
)


def _cents(cost: int, price: str) -> int:
    exact = Decimal(cost) * Decimal(price)
    return int((exact * 100).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


@dataclass
class Event:
    event_id: str
    allowed: bool
    subject: str
    charges: list[tuple[str, int, int]]  # (limit, cost, cents)
    hour: int
    day: int
    at: int


@dataclass
class Model:
    prices: dict[str, dict[int, str | None]] = field(default_factory=dict)
    calls: dict[tuple[str, int], int] = field(default_factory=dict)
    spend: dict[tuple[str, int], int] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    voided: set[str] = field(default_factory=set)

    def price(self, limit: str, at: int) -> str | None:
        changes = sorted((s, p) for s, p in self.prices.get(limit, {}).items() if s <= at)
        return changes[-1][1] if changes else None

    def consume(
        self, event_id: str, subject: str, wanted: list[tuple[str, int]], at: int
    ) -> tuple[bool, list[str]]:
        hour = at - at % HOUR_US
        day = at - at % DAY_US
        charges = []
        for limit, cost in wanted:
            price = self.price(limit, at)
            charges.append((limit, cost, 0 if price is None else _cents(cost, price)))
        amount = sum(cents for _, _, cents in charges)
        calls = sum(cost for limit, cost, _ in charges if limit == "calls")
        denied = []
        if calls and self.calls.get((subject, hour), 0) + calls > CALLS_MAX:
            denied.append("calls")
        if amount and self.spend.get((subject, day), 0) + amount > CAP_CENTS:
            denied.append("spend")
        allowed = not denied
        if allowed:
            self.calls[(subject, hour)] = self.calls.get((subject, hour), 0) + calls
            self.spend[(subject, day)] = self.spend.get((subject, day), 0) + amount
        self.events.append(Event(event_id, allowed, subject, charges, hour, day, at))
        return allowed, denied

    def void(self, event: Event) -> None:
        self.voided.add(event.event_id)
        calls = sum(cost for limit, cost, _ in event.charges if limit == "calls")
        self.calls[(event.subject, event.hour)] -= calls
        self.spend[(event.subject, event.day)] -= sum(c for _, _, c in event.charges)

    def report(self, month_start: int, month_end: int) -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        for event in self.events:
            if not event.allowed or event.event_id in self.voided:
                continue
            if not month_start <= event.at < month_end:
                continue
            for limit, _, cents in event.charges:
                # What the decision charged: a later price change, even one
                # effective at the event's instant, re-prices nothing decided.
                key = (event.subject, limit)
                found[key] = found.get(key, 0) + cents
        return {key: cents for key, cents in found.items() if cents}


def _charges(shape: tuple[int, int, bool]) -> list[tuple[str, int]]:
    calls, tokens, free = shape
    wanted = [("calls", calls)]
    if tokens:
        wanted.append(("tokens", tokens))
    if free:
        wanted.append(("free", 3))
    return wanted


def _run(url: str, operations: list[tuple[Any, ...]]) -> None:
    clock = FrozenClock(START)
    model = Model()
    with Meter(url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        for step, (kind, a, b, c) in enumerate(operations):
            now = to_us(clock())
            if kind == "consume":
                at = clock() + timedelta(seconds=c)
                event_id = f"e{step}"
                wanted = _charges(b)
                charges = [(a, limit, cost) for limit, cost in wanted]
                checked = meter.check(charges=charges, occurred_at=at)
                allowed, denied = model.consume(event_id, a, wanted, to_us(at))
                decision = meter.consume(charges=charges, event_id=event_id, occurred_at=at)
                assert (decision.allowed, sorted(decision.denied_by)) == (allowed, denied)
                assert (checked.allowed, sorted(checked.denied_by)) == (allowed, denied)
                priced = {c.limit: c.price for c in decision.charges if c.price}
                expected = {
                    limit: ("USD", cents)
                    for limit, _, cents in model.events[-1].charges
                    if allowed and model.price(limit, to_us(at)) is not None
                }
                assert priced == expected
            elif kind == "price":
                at = clock() + timedelta(seconds=c)
                model.prices.setdefault(a, {})[to_us(at)] = b
                if b is None:
                    meter.remove_price(a, "USD", effective_from=at)
                else:
                    meter.set_price(a, b, "USD", effective_from=at)
            elif kind == "void":
                allowed_events = [
                    e for e in model.events if e.allowed and e.event_id not in model.voided
                ]
                if allowed_events:
                    event = allowed_events[a % len(allowed_events)]
                    model.void(event)
                    meter.void(event.event_id, "model")
            elif kind == "advance":
                clock.advance(seconds=a)
            assert now <= to_us(clock())
            _compare(meter, model)


def _compare(meter: Meter, model: Model) -> None:
    stored = {
        (c.subject, to_us(c.window_start)): c.used
        for c in meter.counters(limit="spend")
        if c.window_start is not None and c.used
    }
    assert stored == {key: used for key, used in model.spend.items() if used}
    assert all(used <= CAP_CENTS for used in stored.values())
    for month, start, end in [
        ("2026-11", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
    ]:
        report = spend_report(meter, month)
        found = {
            (row.subject, limit): cents
            for row in report.rows
            for limit, cents in row.amounts.items()
        }
        assert found == model.report(to_us(start), to_us(end))
        for row in report.rows:
            assert row.total == sum(row.amounts.values())
            assert (row.spend_limit, row.cap) == ("spend", CAP_CENTS)


SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# A price, an event charged at it, then the price removed at the same instant.
PRICED_THEN_REMOVED = [
    ("price", "calls", "0.01", 0),
    ("consume", "s1", (3, 0, False), 0),
    ("price", "calls", None, 0),
]


@SETTINGS
@example(operations=PRICED_THEN_REMOVED)
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_sqlite_spend_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, operations: list
) -> None:
    directory = tmp_path_factory.mktemp("spend")
    _run(copy_sqlite(sqlite_template, directory / "spend.db"), operations)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(25))
@example(operations=PRICED_THEN_REMOVED)
@given(operations=st.lists(operation, min_size=1, max_size=40))
def test_postgresql_spend_matches_the_model(
    postgres_server: PostgresServer, pg_template_url: str, operations: list
) -> None:
    with postgres_server.copy_of(pg_template_url, "spend") as url:
        _run(url, operations)
