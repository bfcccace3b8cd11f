"""The fast path decides money as the reference engine does, on SQLite and PostgreSQL.

A priced event gets a charge of each of its subjects' spend limits of the
price's currency, of the amounts of the prices in force at its
``occurred_at``, stacked with its own charges: all or nothing
(`metering.engine.money`). Hypothesis drives `Meter.apply` (the fast path:
direct SQLite, SQLAlchemy's SQLite, direct PostgreSQL and its SQLAlchemy
store for what notifies) on one database and the reference engine
(`Engine._apply_reference`) on another with the same stream: several
prices over time and changes mid-stream (some effective in the past,
some in the future, some ending the price), two currencies and a third
with no minor unit, spend limits per currency (hard, soft and shadow;
calendar and first-use; one with thresholds and dimensions), stacked
priced charges, grants and subjects' own caps on spend limits, charges
naming a spend limit (refused), and amounts past the bound (refused).
Results rows, counters, rollups (spend included), notifications and
rejected messages must be identical; a batch with no late event never
reaches the reference engine (`metering_reference_events_total`). On
PostgreSQL `check` (`check_record`) answers what the reference answers.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite
from test_check_path import _answer
from test_fast_path import SETTINGS, _stored

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.events import make_event
from metering.engine.one_trip import STATS
from metering.metrics import metrics

START = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)  # a day's and a month's end are near
LIMITS = [
    Limit("calls", maximum=8, period="1h", window="calendar", thresholds=(50, 100)),
    Limit("tokens", maximum=30, period="1d", window="calendar", enforcement="soft"),
    Limit("fu", maximum=6, period="30m"),
    Limit("bucket", maximum=5, period="60s", algorithm="token_bucket"),
    Limit("shadow", maximum=3, period="1h", window="calendar", enforcement="shadow"),
    Limit("free", maximum=10, period="1h", window="calendar", dimensions=("route",)),
    spend_limit(
        "usd_day",
        "0.30",
        "USD",
        "1d",
        window="calendar",
        thresholds=(50, 100),
        dimensions=("route",),
    ),
    spend_limit("usd_soft", "0.10", "USD", "1h", enforcement="soft", thresholds=(80,)),
    spend_limit("eur_fu", "0.20", "EUR", "2h"),
    spend_limit("jpy_shadow", "30", "JPY", "1h", window="calendar", enforcement="shadow"),
]
PRICED = ["calls", "tokens", "fu", "bucket", "shadow"]
SPEND = ["usd_day", "usd_soft", "eur_fu", "jpy_shadow"]
NAMES = [*PRICED, *PRICED, "free", "usd_day", "unknown"]
SUBJECTS = ["org-1", "org-2"]
# The most an event may charge: at 5,000 a unit or more it costs more than the bound.
BIG = 10**12
PRICES = ["0.002", "0.015", "0.005", "0.125", "1", "0.0049", "5000", None]

charge = st.tuples(
    st.sampled_from(SUBJECTS),
    st.sampled_from(NAMES),
    st.one_of(st.integers(1, 5), st.sampled_from([7, 13, 40, BIG])),
)
# 0 or late: accepted events are never after now, so a batch with no late
# event opens no window after any of its events (the fast path keeps it);
# 600 s ahead is refused (past the future's tolerance).
OFFSETS = [0, 0, -30, -700, -1900, 600]
event = st.fixed_dictionaries(
    {
        "id": st.integers(0, 30),
        "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        "offset_seconds": st.sampled_from(OFFSETS),
        "metadata": st.sampled_from([None, {"route": "/a"}]),
    }
)
price = st.tuples(
    st.sampled_from(PRICED),
    st.sampled_from(PRICES),
    st.sampled_from(["USD", "USD", "EUR", "JPY"]),
    st.sampled_from([0, -600, -2400, 900]),  # effective from: now, earlier, later
)
batch = st.fixed_dictionaries(
    {
        "advance_seconds": st.sampled_from([0, 20, 61, 900, 3600]),
        "prices": st.lists(price, max_size=3),
        "events": st.lists(event, min_size=1, max_size=10),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(SPEND),
                st.one_of(st.none(), st.integers(1, 60)),
            ),
            max_size=1,
        ),
        "grants": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(["usd_day", "eur_fu", "calls"]),
                st.integers(1, 20),
            ),
            max_size=1,
        ),
    }
)
streams = st.lists(batch, min_size=1, max_size=6)


def _reference_events(path: str = "apply") -> float:
    found = metrics().registry.get_sample_value("metering_reference_events_total", {"path": path})
    return found or 0.0


def _change(meter: Meter, spec: dict[str, Any], now: datetime, number: int) -> None:
    for limit, per_unit, currency, offset in spec["prices"]:
        when = now + timedelta(seconds=offset)
        if per_unit is None:
            meter.remove_price(limit, currency, effective_from=when)
        else:
            meter.set_price(limit, per_unit, currency, effective_from=when)
    for subject, limit, maximum in spec["entitlements"]:
        meter.set_entitlement(subject, limit, maximum, effective_from=now)
    for index, (subject, limit, amount) in enumerate(spec["grants"]):
        grant_id = f"g-{number}-{index}"
        meter.grant(subject, limit, amount, now + timedelta(hours=2), grant_id=grant_id)


def _records(spec: dict[str, Any], now: datetime) -> list[Any]:
    return [
        make_event(
            item["charges"],
            now + timedelta(seconds=item["offset_seconds"]),
            f"ev-{item['id']}",
            item["metadata"],
        ).record()
        for item in spec["events"]
    ]


def _compare_checks(meter: Meter, spec: dict[str, Any]) -> None:
    """`check` on the fast path (PostgreSQL) and on the reference, event by event."""
    now = meter.clock()
    for item in spec["events"]:
        when = now + timedelta(seconds=item["offset_seconds"])
        hot = _answer(partial(meter.check, charges=item["charges"], occurred_at=when))
        event = make_event(item["charges"], when, "check")
        general = _answer(partial(meter._engine._check_reference, event, meter.database.now_us()))
        assert hot == general, item


def _run(fast_url: str, general_url: str, stream: list[dict[str, Any]], checks: bool) -> None:
    clock = FrozenClock(START)
    with Meter(fast_url, clock=clock) as fast, Meter(general_url, clock=clock) as general:
        for meter in (fast, general):
            meter.set_limits(LIMITS)
            meter.set_price("calls", "0.01", "USD", effective_from=START - timedelta(days=1))
            meter.set_price("tokens", "0.0025", "EUR", effective_from=START - timedelta(days=1))
            meter.set_price("shadow", "20000", "JPY", effective_from=START - timedelta(days=1))
        for number, spec in enumerate(stream):
            clock.advance(seconds=spec["advance_seconds"])
            for meter in (fast, general):
                _change(meter, spec, clock(), number)
            if checks:
                _compare_checks(fast, spec)
            records = _records(spec, clock())
            before = _reference_events()
            fast.apply_records(records, invalid="reject")
            if all(item["offset_seconds"] >= 0 for item in spec["events"]):
                assert _reference_events() == before, "the reference engine decided"
            general._engine._apply_reference(records, fast.database.now_us(), "reject", ())
        assert _stored(fast) == _stored(general)


@pytest.mark.slow
@SETTINGS
@given(stream=streams, memory=st.booleans())
def test_sqlite_fast_path_decides_money_as_the_reference(
    sqlite_template: Path, stream: list[dict[str, Any]], memory: bool
) -> None:
    """``memory``: SQLAlchemy's in-memory SQLite (its hot store), else the direct one."""
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = "sqlite://" if memory else copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "general.db"), stream, checks=False)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=25)
@given(stream=streams)
def test_postgresql_fast_path_decides_money_as_the_reference(
    postgres_server: PostgresServer, pg_template_url: str, stream: list[dict[str, Any]]
) -> None:
    with (
        postgres_server.copy_of(pg_template_url, "money") as fast,
        postgres_server.copy_of(pg_template_url, "money") as general,
    ):
        _run(fast, general, stream, checks=True)


NOW = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def test_priced_events_are_decided_by_the_fast_path(db_url: str) -> None:
    """consume, apply and (PostgreSQL) check of priced usage never reach the
    reference engine, nor the one-trip function; the cap denies all or nothing."""
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                Limit("tokens", maximum=10**6, period="1d"),
                spend_limit("cap", "0.10", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD")
        meter.set_price("tokens", "0.001", "USD")
        applied, checked, one_trip = _reference_events(), _reference_events("check"), dict(STATS)
        assert meter.check("org-1", "calls", 3).allowed
        first = meter.consume(charges=[("org-1", "calls", 3), ("org-1", "tokens", 2)])
        assert first.allowed
        assert [(c.limit, c.price) for c in first.charges] == [
            ("calls", ("USD", 3)),
            ("tokens", ("USD", 0)),
            ("cap", None),
        ]
        assert first.charges[2].used == 3
        [denied] = meter.apply([make_event([("org-1", "calls", 8)], NOW, "e-2")])
        assert denied.denied_by == ("cap",)
        assert [(c.limit, c.used, c.price) for c in denied.charges] == [
            ("calls", 3, None),
            ("cap", 3, None),
        ]
        assert meter.consume("org-1", "calls", 7).allowed
        assert meter.check("org-1", "calls", 1).denied_by == ("cap",)
        assert meter.consume("org-2", "calls").charges[-1].used == 1
        assert _reference_events() == applied
        if db_url.startswith("postgresql"):
            assert _reference_events("check") == checked
        assert STATS["applied"] == one_trip.get("applied", 0)
        # What the fast path leaves (an event before its first-use window) is counted.
        late = meter.consume("org-1", "tokens", 1, occurred_at=NOW - timedelta(minutes=30))
        assert [(c.limit, c.price) for c in late.charges] == [("tokens", None)]  # before its price
        assert _reference_events() == applied + 1


def _change_price(url: str) -> None:
    with Meter(url, clock=FrozenClock(NOW)) as other:
        other.set_price("calls", "0.05", "USD")


def test_a_price_changed_in_another_process_applies_to_the_next_decision(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1h", window="calendar"),
                spend_limit("cap", "1", "USD", "1d", window="calendar"),
            ]
        )
        meter.set_price("calls", "0.01", "USD", effective_from=NOW - timedelta(hours=1))
        assert meter.consume("org-1", "calls").charges[0].price == ("USD", 1)  # cached here
        process = multiprocessing.get_context("fork").Process(target=_change_price, args=(db_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        assert meter.consume("org-1", "calls").charges[0].price == ("USD", 5)
        if db_url.startswith("postgresql"):
            assert meter.check("org-1", "calls").charges[0].price == ("USD", 5)
