"""Backtests (`metering/simulation.py`, `Meter.simulate`) over a real ledger, on
SQLite and PostgreSQL.

A recorded stream (decided by the meter, some events denied, one voided,
one rejected) is replayed through a changed maximum: the figures are those
of an independent model, and nothing stored changes (every table's rows
counted before and after). Bad input and a pruned period are refused.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput, MeteringError, PeriodPruned
from metering.storage.tables import metadata

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)  # on the hour
NOW = T0 + timedelta(hours=5)
SUBJECTS = ("org-1", "org-2", "org-3")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("calls", maximum=12, period="1h", window="calendar", lateness="1d"))
        yield m


def record(meter: Meter, clock: FrozenClock) -> list[tuple[datetime, str, int]]:
    """A seeded stream over four hours, decided as it comes; returns what counts."""
    rng = random.Random(23)
    stream: list[tuple[datetime, str, int]] = []
    for index in range(60):
        at = T0 + timedelta(minutes=4 * index + rng.randrange(4))
        clock.set(at)
        subject, cost = rng.choice(SUBJECTS), rng.randint(1, 4)
        meter.consume(subject, "calls", cost, event_id=f"e{index}")
        stream.append((at, subject, cost))
    clock.set(NOW)
    meter.void("e0", "a mistake")  # voided: not demand any more
    stream.pop(0)
    return stream


def model(stream: list[tuple[datetime, str, int]], maximum: int) -> dict[str, tuple[int, ...]]:
    """(events, would-deny events, their cost) per subject, an hourly hard window."""
    used: dict[tuple[str, datetime], int] = defaultdict(int)
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for at, subject, cost in stream:
        hour = at.replace(minute=0, second=0, microsecond=0)
        figures = found[subject]
        figures[0] += 1
        if used[(subject, hour)] + cost > maximum:
            figures[1] += 1
            figures[2] += cost
        else:
            used[(subject, hour)] += cost
    return {subject: tuple(f) for subject, f in found.items()}


def row_counts(meter: Meter) -> dict[str, int]:
    with meter.sql_engine.connect() as connection:
        return {
            table.name: connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in metadata.sorted_tables
        }


def limits_file(tmp_path: Path, maximum: int) -> Path:
    path = tmp_path / "proposed.yaml"
    path.write_text(f"calls:\n  maximum: {maximum}\n  period: 1h\n  window: calendar\n")
    return path


@pytest.mark.parametrize("maximum", [5, 12])
def test_backtest_gives_the_models_would_deny_counts(
    meter: Meter, clock: FrozenClock, tmp_path: Path, maximum: int
) -> None:
    stream = record(meter, clock)
    with pytest.raises(MeteringError):  # rejected: not demand
        meter.consume("org-1", "missing", event_id="bad")
    before = row_counts(meter)
    found = meter.simulate(limits_file(tmp_path, maximum), since=timedelta(days=1))
    assert row_counts(meter) == before  # nothing written
    got = {r.subject: (r.events, r.would_deny_events, r.would_deny_cost) for r in found.rows}
    assert got == model(stream, maximum)
    assert found.events == len(stream)
    # At the maximum in force, the replay denies what was denied then.
    if maximum == 12:
        assert all(r.would_deny_events == r.denied_events_then for r in found.rows)
    assert {r.limit for r in found.rows} == {"calls"}


def test_subject_and_entitlements(meter: Meter, clock: FrozenClock, tmp_path: Path) -> None:
    stream = record(meter, clock)
    entitlements = tmp_path / "e.yaml"
    entitlements.write_text("- {subject: org-2, limit: calls, maximum: 3}\n")
    found = meter.simulate(
        [Limit("calls", maximum=12, period="1h", window="calendar")],
        entitlements,
        since=T0,
        subject="org-2",
    )
    [row] = found.rows
    assert (row.subject, row.events, row.would_deny_events, row.would_deny_cost) == (
        "org-2",
        *model(stream, 3)["org-2"],
    )


def test_a_pruned_period_is_refused(
    meter: Meter, clock: FrozenClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(meter, clock)
    monkeypatch.setenv("METERING_RETAIN_RESULTS_DAYS", "7")
    with pytest.raises(PeriodPruned, match="no longer holds") as caught:
        meter.simulate(limits_file(tmp_path, 5), since=timedelta(days=30))
    assert caught.value.kept_from == NOW - timedelta(days=7)
    assert meter.simulate(limits_file(tmp_path, 5), since=timedelta(days=6)).events == 59


def test_bad_input_is_refused(meter: Meter, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("calls: [maximum: 3\n")
    bad_limit = tmp_path / "bad.yaml"
    bad_limit.write_text("calls: {maximum: -1, period: 1h}\n")
    unknown = tmp_path / "e.yaml"
    unknown.write_text("- {subject: s, limit: nope, maximum: 3}\n")
    good = limits_file(tmp_path, 5)
    cases = [
        ((broken,), {"since": timedelta(days=1)}, "not valid YAML"),
        ((bad_limit,), {"since": timedelta(days=1)}, "maximum"),
        ((good, unknown), {"since": timedelta(days=1)}, "no limit named 'nope'"),
        ((good,), {"since": NOW + timedelta(hours=1)}, "in the future"),
        ((good,), {"since": datetime(2026, 11, 1)}, "timezone-aware"),
        ((good,), {"since": timedelta(days=1), "subject": ""}, "subject"),
        ((["calls"],), {"since": timedelta(days=1)}, "expected Limit"),
        (
            ([Limit("metering.x", maximum=1, period="1h")],),
            {"since": timedelta(days=1)},
            "metering",
        ),
    ]
    before = row_counts(meter)
    for args, options, message in cases:
        with pytest.raises(MeteringError, match=message):
            meter.simulate(*args, **options)  # type: ignore[arg-type]
    assert row_counts(meter) == before
    with pytest.raises(InvalidInput):
        meter.simulate(good, since=NOW + timedelta(hours=1))


def test_a_reservation_counts_at_its_reserved_cost(
    meter: Meter, clock: FrozenClock, tmp_path: Path
) -> None:
    held = meter.reserve("org-9", "calls", 5, event_id="r1")
    held.cancel()  # given back, yet demanded: the result row is the event
    meter.reserve("org-9", "calls", 1, event_id="r2").commit()
    [row] = meter.simulate(limits_file(tmp_path, 4), since=timedelta(hours=1)).rows
    assert (row.events, row.would_deny_events, row.would_deny_cost) == (2, 1, 5)


def seats_and_spend_model(
    stream: list[str], seats: int, cents: int, price: int
) -> dict[str, tuple[int, int, int]]:
    """(events, would-deny events, their cost) of the seat and spend limits,
    one day, every event one call at ``price`` cents by the user named."""
    held: set[str] = set()
    spent = 0
    seat_denials = spend_denials = 0
    for user in stream:
        new_seat = user not in held
        seat_fits = not new_seat or len(held) < seats
        spend_fits = spent + price <= cents
        seat_denials += not seat_fits
        spend_denials += not spend_fits
        if seat_fits and spend_fits:
            held.add(user)
            spent += price
    return {
        "seats": (len(stream), seat_denials, seat_denials),
        "spend": (len(stream), spend_denials, spend_denials * price),
    }


@pytest.mark.parametrize(("seats", "cap"), [(4, "1.00"), (2, "0.50"), (6, "2.00")])
def test_seats_and_a_spend_cap_are_replayed(
    meter: Meter, clock: FrozenClock, seats: int, cap: str
) -> None:
    """Recorded under 4 seats and a 1.00 USD cap at 0.05 a call, replayed
    under the limits given: the model's figures; under the limits in force,
    what was denied then."""
    from metering import spend_limit

    day = {"period": "1d", "window": "calendar"}
    meter.set_limits(
        [
            Limit("calls", maximum=1000, **day),  # never denies: the model leaves it out
            Limit("seats", maximum=4, distinct="user", **day),
            spend_limit("spend", "1.00", "USD", **day),
        ]
    )
    meter.set_price("calls", "0.05", "USD")
    rng = random.Random(7)
    stream = []
    for index in range(40):
        clock.set(T0 + timedelta(minutes=index))
        user = f"u{rng.randrange(7)}"
        meter.consume(
            charges=[("org-1", "calls", 1), ("org-1", "seats", 1)], metadata={"user": user}
        )
        stream.append(user)
    clock.set(NOW)
    before = row_counts(meter)
    proposed = [
        Limit("seats", maximum=seats, distinct="user", **day),
        spend_limit("spend", cap, "USD", **day),
    ]
    found = meter.simulate(proposed, since=T0)
    assert row_counts(meter) == before
    got = {r.limit: (r.events, r.would_deny_events, r.would_deny_cost) for r in found.rows}
    cents = round(float(cap) * 100)
    assert {k: got[k] for k in ("seats", "spend")} == seats_and_spend_model(stream, seats, cents, 5)
    if (seats, cap) == (4, "1.00"):
        assert all(r.would_deny_events == r.denied_events_then for r in found.rows)
        assert sum(r.denied_events_then for r in found.rows) > 0
