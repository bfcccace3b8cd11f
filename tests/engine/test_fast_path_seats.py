"""Seats on the hot path: the same results as the general engine, on SQLite and PostgreSQL.

`Meter.apply` decides charges on seat limits (``distinct="user"``) by the
lean rules (`metering.engine.fast`), with the values' live events read in
the hot store's one locked read and written in its one write; the general
engine (`Engine._apply_reference`) decides them by `metering.engine.seats`.
Hypothesis drives both, each on its own database, with the same stream of
batches: hard, soft (with thresholds and dimensions), shadow and first-use
seat limits, stacked with a plain limit; new values and repeats of held
ones in the same batch and across batches; values missing, empty, numeric
(``7`` is ``"7"``) and charges of cost 2 (rejected); windows rolling over;
a seat limit's maximum lowered; subjects' own maximums lowering it (some
effective in the past); grants. Results, counters, the seats' live events
(``distinct_values``), grants and draws, usage rollups, notifications and
rejected messages must be identical; on PostgreSQL every batch is followed
by checks (`Meter.check`, `check_record`) that must answer as the general
engine's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from round_trips import count_round_trips
from servers import PostgresServer, copy_sqlite
from sqlalchemy import select
from test_check_path import _answer
from test_fast_path import SETTINGS, _stored

from metering import FrozenClock, Limit, Meter
from metering.domain.events import UsageEvent, make_event
from metering.storage.tables import distinct_values

START = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # a month's end is near
SEATS = Limit("seats", maximum=2, period="1h", window="calendar", distinct="user")
LIMITS = [
    SEATS,
    Limit("fu_seats", maximum=2, period="30m", distinct="user"),
    Limit(
        "soft_seats",
        maximum=2,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(50, 100),
        distinct="user",
        dimensions=("route",),
    ),
    Limit(
        "shadow_seats",
        maximum=1,
        period="1h",
        window="calendar",
        enforcement="shadow",
        distinct="user",
    ),
    Limit("calls", maximum=5, period="1h", window="calendar"),
]
SEAT_NAMES = [limit.name for limit in LIMITS if limit.distinct]
NAMES = [limit.name for limit in LIMITS]
SUBJECTS = ["org-1", "org-2"]
METADATA = [
    {"user": "a"},
    {"user": "b"},
    {"user": "c", "route": "/a"},
    {"user": "d"},
    {"user": 7},
    {"user": "7", "route": "/b"},
    {"route": "/b"},  # no value: rejected on a seat limit
    {"user": ""},  # not a value: rejected
    None,
]

charge = st.tuples(
    st.sampled_from(SUBJECTS),
    st.sampled_from([*SEAT_NAMES, *SEAT_NAMES, "calls"]),
    st.sampled_from([1, 1, 1, 1, 1, 2]),  # 2: refused on a seat limit
)
event = st.fixed_dictionaries(
    {
        "id": st.integers(0, 30),  # small: ids repeat across and inside batches
        "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        "offset_seconds": st.sampled_from([0, 0, 0, -30, -700, 600]),
        "metadata": st.sampled_from(METADATA),
    }
)
batch = st.fixed_dictionaries(
    {
        "advance_seconds": st.sampled_from([0, 0, 20, 900, 1900, 3600]),
        "events": st.lists(event, min_size=1, max_size=10),
        "new_seats_maximum": st.one_of(st.none(), st.integers(1, 3)),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(SEAT_NAMES),
                st.one_of(st.none(), st.integers(1, 3)),
                st.sampled_from([0, -600]),  # effective from: now, or inside the window
            ),
            max_size=2,
        ),
        "grants": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(SEAT_NAMES),
                st.integers(1, 2),
                st.sampled_from([None, 1000]),  # expires after: never, or seconds
            ),
            max_size=1,
        ),
    }
)
streams = st.lists(batch, min_size=1, max_size=6)
checks = st.lists(
    st.fixed_dictionaries(
        {
            "charges": st.lists(charge, min_size=1, max_size=2, unique_by=lambda c: c[:2]),
            "offset_seconds": st.sampled_from([0, -700, 600]),
            "metadata": st.sampled_from(METADATA),
        }
    ),
    max_size=4,
)


def _events(spec: dict[str, Any], now: datetime) -> list[UsageEvent]:
    return [
        make_event(
            item["charges"],
            now + timedelta(seconds=item["offset_seconds"]),
            f"ev-{item['id']}",
            item["metadata"],
        )
        for item in spec["events"]
    ]


def _allowances(meter: Meter, spec: dict[str, Any], now: datetime, number: int) -> None:
    for subject, limit, maximum, offset in spec["entitlements"]:
        meter.set_entitlement(
            subject, limit, maximum, effective_from=now + timedelta(seconds=offset)
        )
    for index, (subject, limit, amount, expires) in enumerate(spec["grants"]):
        expires_at = None if expires is None else now + timedelta(seconds=expires)
        meter.grant(subject, limit, amount, expires_at, grant_id=f"g-{number}-{index}")


def _seats(meter: Meter) -> list[tuple[object, ...]]:
    with meter.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(select(distinct_values)))


def _compare_checks(meter: Meter, specs: Sequence[dict[str, Any]]) -> None:
    now = meter.clock()
    for spec in specs:
        when = now + timedelta(seconds=spec["offset_seconds"])
        ask = partial(meter.check, charges=spec["charges"], occurred_at=when)
        hot = _answer(partial(ask, metadata=spec["metadata"]))
        event = make_event(spec["charges"], when, "check", spec["metadata"])
        general = _answer(partial(meter._engine._check_reference, event, meter.database.now_us()))
        assert hot == general, spec


def _run(
    fast_url: str,
    general_url: str,
    stream: list[dict[str, Any]],
    specs: Sequence[dict[str, Any]] = (),
) -> None:
    clock = FrozenClock(START)
    with Meter(fast_url, clock=clock) as fast, Meter(general_url, clock=clock) as general:
        fast.set_limits(LIMITS)
        general.set_limits(LIMITS)
        for number, spec in enumerate(stream):
            clock.advance(seconds=spec["advance_seconds"])
            maximum = spec["new_seats_maximum"]
            if isinstance(maximum, int):
                changed = Limit(
                    "seats", maximum=maximum, period="1h", window="calendar", distinct="user"
                )
                fast.set_limit(changed)
                general.set_limit(changed)
            for meter in (fast, general):
                _allowances(meter, spec, clock(), number)
            records = [e.record() for e in _events(spec, clock())]
            fast.apply_records(records, invalid="reject")
            general._engine._apply_reference(records, fast.database.now_us(), "reject", ())
            _compare_checks(fast, specs)
        assert _stored(fast) == _stored(general)
        assert _seats(fast) == _seats(general)


@pytest.mark.slow
@SETTINGS
@given(stream=streams)
def test_sqlite_hot_path_decides_seats_as_the_general_engine(
    sqlite_template: Path, stream: list[dict[str, Any]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "general.db"), stream)


@contextmanager
def _two_databases(server: PostgresServer, template: str) -> Iterator[tuple[str, str]]:
    with server.copy_of(template, "seats") as fast, server.copy_of(template, "seats") as general:
        yield fast, general


@pytest.mark.postgres
@settings(SETTINGS, max_examples=25)
@given(stream=streams, specs=checks)
def test_postgresql_hot_path_decides_seats_as_the_general_engine(
    postgres_server: PostgresServer,
    pg_template_url: str,
    stream: list[dict[str, Any]],
    specs: list[dict[str, Any]],
) -> None:
    with _two_databases(postgres_server, pg_template_url) as (fast_url, general_url):
        _run(fast_url, general_url, stream, specs)


def _refuse(*_args: object) -> None:
    raise AssertionError("the general engine ran")


def test_the_hot_path_decides_seat_events(db_url: str) -> None:
    """New values, repeats in a batch and across batches, a first-use and a
    calendar window, a denial and a repeat past the maximum: none reaches
    the general engine, on either database (and `check` neither, on PostgreSQL)."""
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter._engine._apply_reference = _refuse  # type: ignore[method-assign]
        if db_url.startswith("postgresql"):
            meter._engine._check_reference = _refuse  # type: ignore[assignment, method-assign]
        users = ["a", "b", "a", "c", "b"]
        batch = [
            make_event(
                [("org-1", "seats", 1), ("org-1", "fu_seats", 1)], clock(), None, {"user": u}
            )
            for u in users
        ]
        answers = meter.apply_records([e.record() for e in batch])
        assert [result.outcome for _, result in answers if result] == [
            "allowed",
            "allowed",
            "allowed",
            "denied",  # a third value: both limits hold 2
            "allowed",
        ]
        assert meter.check("org-1", "seats", metadata={"user": "a"}).allowed
        assert meter.check("org-1", "seats", metadata={"user": "c"}).denied_by == ("seats",)
        meter.set_entitlement("org-1", "seats", 1)
        repeat = meter.consume("org-1", "seats", metadata={"user": "b"})
        assert (repeat.outcome, repeat.charges[0].cost, repeat.charges[0].overage) == (
            "allowed",
            0,
            0,
        )
        assert meter.seats("org-1", "seats") == ["a", "b"]
        clock.advance(seconds=3600)  # both windows roll over
        assert meter.consume("org-1", "fu_seats", metadata={"user": "c"}).allowed
        assert meter.seats("org-1", "fu_seats") == ["c"]


@pytest.mark.postgres
def test_seats_add_no_round_trip_on_postgresql(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values' live events ride in the read's pipeline and the write's:
    a batch of seat events (first-use and calendar, new values and repeats)
    is two round trips, as any batch; a `check` is one."""
    trips = count_round_trips(monkeypatch)
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.consume("org-1", "calls")  # warm: the limits are cached
        events = [
            make_event(
                [(f"org-{n % 7}", "seats", 1), (f"org-{n % 7}", "fu_seats", 1)],
                clock(),
                f"e{n}",
                {"user": f"u{n % 2}"},  # no denial: it would notify, after the write
            )
            for n in range(40)
        ]
        trips[0] = 0
        answers = meter.apply_records([e.record() for e in events])
        assert trips[0] == 2
        assert {result.outcome for _, result in answers if result} == {"allowed"}
        assert meter.seats("org-1", "fu_seats") == ["u0", "u1"]
        trips[0] = 0
        assert meter.check("org-1", "seats", metadata={"user": "u0"}).allowed
        assert trips[0] == 1
