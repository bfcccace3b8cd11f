"""Reservations on the fast path agree with the reference engine, on SQLite and PostgreSQL.

`Meter.reserve` and a lease's block decide through the fast path
(`metering.engine.fast.apply_records` with a `Hold`), writing the
reservation row in the same transaction. Hypothesis drives it and the
reference engine (the only path of the other `Meter`), each on its own
database, with the same random stream of reservations, lease blocks (a
denied block records nothing), consumes of the same ids, cancels and
commits (settled on the engine's own connections on one side, under
SQLAlchemy on the other): stacked charges, first-use and calendar
windows, token buckets, soft and shadow limits, ids repeated (duplicates
and conflicts), late events (some before their subject's current
first-use window, which the fast path leaves to the reference engine) and
unknown limits. Every answer (decision, state, expiry, or the error), and
the results, counters, reservations, rollups and notification marks stored
must be identical.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from budgets import examples
from engine.differential import BATCH_LIMITS, START, SUBJECTS, stored
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Meter, spend_limit
from metering.domain.events import make_event
from metering.domain.limits import Limit
from metering.errors import MeteringError
from metering.reservations.transactions import lease, reserve

# Shrinking these streams takes minutes: a failure is reported as found.
NO_SHRINK = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
# PostgreSQL's budget: 60 examples were three minutes, once the slowest
# test of the suite (`make test` is to stay under 12).
ON_POSTGRES = settings(NO_SHRINK, max_examples=examples(25))
# With limits of no dimensions ("fu", "units", "plain-bucket") a give-back
# settles on the direct path; the others roll usage up (the general path).
# "priced" (a cent a unit) and "tiered" (graduated, with a flat fee: its
# money differs from its units) cost money, capped by "usd_cap" (charged
# directly: refused); commits at an actual below, at and above what was
# reserved keep the money of the units kept.
RESERVING_LIMITS = [
    *BATCH_LIMITS,
    Limit("plain-bucket", maximum=20, period="60s", algorithm="token_bucket"),
    Limit("big", maximum=100, period="1h", window="calendar"),
    Limit("priced", maximum=30, period="1h", window="calendar"),
    Limit("tiered", maximum=30, period="1h", window="calendar"),
    spend_limit("usd_cap", "0.40", "USD", "1h", window="calendar"),
]
NAMES = [limit.name for limit in RESERVING_LIMITS] + ["unknown"]
charge = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(NAMES), st.integers(1, 4))
step = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["reserve", "reserve", "block", "consume", "cancel", "commit"]),
        "id": st.integers(0, 25),  # small: ids repeat
        "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        "offset_seconds": st.sampled_from([0, 0, -30, -1900, -4000, 600]),
        "advance_seconds": st.sampled_from([0, 0, 20, 61, 900, 1900]),
        "ttl_seconds": st.sampled_from([1, 60, 3600]),
        "actual": st.one_of(st.none(), st.integers(0, 4)),
    }
)
streams = st.lists(step, min_size=1, max_size=25)
# Mostly settles of reservations that are held: few ids, limits that allow.
settle_step = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["reserve", "reserve", "cancel", "commit", "commit"]),
        "id": st.integers(0, 5),
        "charges": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS[:2]),
                st.sampled_from(
                    ["big", "big", "plain-bucket", "units", "cal", "priced", "tiered", "tiered"]
                ),
                st.integers(1, 4),
            ),
            min_size=1,
            max_size=3,
            unique_by=lambda c: c[:2],
        ),
        "offset_seconds": st.just(0),
        "advance_seconds": st.sampled_from([0, 0, 5, 61, 1900]),
        "ttl_seconds": st.sampled_from([60, 3600]),
        "actual": st.one_of(st.none(), st.integers(0, 4)),
    }
)
settle_streams = st.lists(settle_step, min_size=1, max_size=25)


def _settle(kind: str, number: int, actual: int | None = None, **more: object) -> dict[str, object]:
    return {
        "kind": kind,
        "id": number,
        "charges": more.get("charges", []),
        "offset_seconds": 0,
        "advance_seconds": more.get("advance", 0),
        "ttl_seconds": 3600,
        "actual": actual,
    }


# Every run: priced commits below, at and above what was reserved (a
# graduated price with a flat fee, and a cent a unit beside unpriced usage).
PRICED_SETTLES = [
    _settle("reserve", 1, charges=[("org-1", "tiered", 4), ("org-1", "big", 2)]),
    _settle("reserve", 2, charges=[("org-1", "tiered", 3), ("org-1", "priced", 2)]),
    _settle("commit", 1, 2),
    _settle("commit", 1, 2),
    _settle("commit", 2, 4),
    _settle("commit", 2, 1, advance=5),
    _settle("reserve", 3, charges=[("org-2", "tiered", 2)]),
    _settle("commit", 3, 0),
    _settle("reserve", 4, charges=[("org-2", "priced", 4), ("org-2", "tiered", 1)]),
    _settle("commit", 4, 1),
    _settle("consume", 5, charges=[("org-1", "tiered", 1)]),
]


def _step(meter: Meter, spec: dict[str, object], clock: FrozenClock) -> object:
    """One step on one meter; its answer (or error) as plain values."""
    kind = spec["kind"]
    event_id = f"ev-{spec['id']}"
    try:
        if kind == "cancel":
            return meter.cancel_reservation(event_id)
        if kind == "commit":
            actual = spec["actual"]
            return meter.commit_reservation(event_id, actual)  # type: ignore[arg-type]
        when = clock() + timedelta(seconds=spec["offset_seconds"])  # type: ignore[arg-type]
        event = make_event(spec["charges"], when, event_id)  # type: ignore[arg-type]
        if kind == "consume":
            return [_plain(applied) for applied in meter.apply([event])]
        now_us = meter.database.now_us()
        ttl_us = round(spec["ttl_seconds"] * 1_000_000)  # type: ignore[operator]
        if kind == "block":
            return lease(meter._engine, event, now_us + ttl_us)
        return reserve(meter._engine, event, ttl_us)
    except MeteringError as exc:
        return (type(exc).__name__, str(exc))


def _plain(value: object) -> object:
    return (type(value).__name__, str(value)) if isinstance(value, Exception) else value


def _run(fast_url: str, reference_url: str, stream: list[dict[str, object]]) -> None:
    clock = FrozenClock(START)
    with Meter(fast_url, clock=clock) as fast, Meter(reference_url, clock=clock) as reference:
        for meter in (fast, reference):
            meter.set_limits(RESERVING_LIMITS)
            meter.set_price("priced", "0.01", "USD", effective_from=START - timedelta(days=1))
            meter.set_price(
                "tiered",
                None,
                "USD",
                model="graduated",
                tiers=["3:0.02", "inf:0.015"],
                flat_fee="0.03",
                effective_from=START - timedelta(days=1),
            )
        # The reference settles under SQLAlchemy (`metering.reservations.transactions._settle`'s
        # ``work``); the fast one on the engine's own connections where it can.
        reference._engine.settle = lambda direct, general: general()  # type: ignore[method-assign]
        reference._engine.paths = [reference._engine.path("reference")]
        for spec in stream:
            clock.advance(seconds=spec["advance_seconds"])  # type: ignore[arg-type]
            assert _step(fast, spec, clock) == _step(reference, spec, clock), spec
        assert stored(fast) == stored(reference)


@contextmanager
def _two_databases(server: PostgresServer, template: str) -> Iterator[tuple[str, str]]:
    with server.copy_of(template, "diff") as fast, server.copy_of(template, "diff") as reference:
        yield fast, reference


@pytest.mark.slow
@NO_SHRINK
@given(stream=streams)
def test_sqlite_reservations_on_the_fast_path_match_the_reference_engine(
    sqlite_template: Path, stream: list[dict[str, object]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "reference.db"), stream)


@pytest.mark.postgres
@ON_POSTGRES
@given(stream=streams)
def test_postgresql_reservations_on_the_fast_path_match_the_reference_engine(
    postgres_server: PostgresServer, pg_template_url: str, stream: list[dict[str, object]]
) -> None:
    with _two_databases(postgres_server, pg_template_url) as (fast_url, reference_url):
        _run(fast_url, reference_url, stream)


@pytest.mark.slow
@NO_SHRINK
@given(stream=settle_streams)
@example(stream=PRICED_SETTLES)
def test_sqlite_settles_on_the_direct_path_match_sqlalchemy(
    sqlite_template: Path, stream: list[dict[str, object]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "reference.db"), stream)


@pytest.mark.postgres
@ON_POSTGRES
@given(stream=settle_streams)
@example(stream=PRICED_SETTLES)
def test_postgresql_settles_on_the_direct_path_match_sqlalchemy(
    postgres_server: PostgresServer, pg_template_url: str, stream: list[dict[str, object]]
) -> None:
    with _two_databases(postgres_server, pg_template_url) as (fast_url, reference_url):
        _run(fast_url, reference_url, stream)


def test_an_ordinary_reservation_never_reaches_the_reference_engine(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reservations and lease blocks decide on the fast path (they ran on the
    reference engine before); a denied block still records nothing."""
    import metering.engine.paths

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the reference engine ran")

    monkeypatch.setattr(metering.engine.paths, "apply_events", refuse)
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(BATCH_LIMITS)
        charges = [("org-1", "fu", 2), ("org-1", "cal", 1)]
        held = meter.reserve(charges=charges, event_id="r-1")
        assert (held.state, held.decision.remaining) == ("held", 2)
        assert meter.reserve(charges=charges, event_id="r-1").state == "held"
        assert held.commit(actual=1) == 1  # the unit of "fu" above 1 goes back
        event = make_event([("org-2", "fu", 5)], clock(), "block-1")
        assert lease(meter._engine, event, meter.database.now_us() + 10_000_000) is None
        assert meter.result("block-1") is None
        assert [r.id for r in meter.reservations()] == ["r-1"]
