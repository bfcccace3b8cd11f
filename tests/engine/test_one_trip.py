"""The one-round-trip path and the reference engine agree (issue 20, point 3).

On PostgreSQL a single event is decided by ``metering_consume_one``
(`metering.engine.one_trip`) when it can; what it declines takes the usual
fast path. Hypothesis drives three databases with the same random stream of
single events: one `Meter` with the one-trip path, one on the old fast path
(``one_trip`` off), and the reference engine (`Engine._apply_reference`).
Results rows, counters, first-use windows, notification marks and messages
(would-deny marks among them), usage rollups, grants and dead letters must
equal the reference's; answers and the `_count` metrics must equal the old
path's. The streams hold calendar and first-use windows across their ends,
token buckets whose capacity does not divide the period, hard, soft and
shadow limits, stacked charges with one failing, entitlement changes,
thresholds, repeated ids (some with other charges), grants, a limit with
dimensions, a first-use window in months, late events, and events past
their lateness or from the future, some applied as `consume` applies them
(``invalid="raise"``): every path raises the same error, or answers a
decided id first (its duplicate or conflict).

On SQLite the one-trip path does not exist: the same module holds the fast
path to the reference. On PostgreSQL `STATS` shows the function decided
most events, so the test cannot pass vacuously.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.engine import core
from metering.engine.fast import Answer
from metering.engine.one_trip import STATS
from metering.errors import MeteringError
from metering.storage.tables import (
    counters,
    current_windows,
    grant_draws,
    grants,
    rejected_messages,
    results,
    usage_rollups,
    webhook_marks,
    webhook_messages,
)

START = datetime(2026, 11, 30, 23, 40, tzinfo=UTC)  # an hour's and a month's end are near
LIMITS = [
    Limit("cal", maximum=6, period="1h", window="calendar"),
    Limit("fu", maximum=4, period="30m"),
    Limit("bucket", maximum=3, period="10s", algorithm="token_bucket"),
    Limit("soft", maximum=5, period="1h", window="calendar", enforcement="soft"),
    Limit("shadow", maximum=3, period="20m", enforcement="shadow"),
    Limit("marks", maximum=8, period="1h", window="calendar", thresholds=(50,)),
    Limit("units", maximum=9, period="30m", thresholds_units=(3, 7)),
    Limit("dims", maximum=5, period="1h", window="calendar", dimensions=("route",)),
    Limit("month", maximum=5, period="1mo"),
]
GRANTABLE = ["soft", "marks"]
# Mostly the limits the function decides alone.
ORDINARY = ["cal", "fu", "bucket", "soft", "shadow", "marks", "units"]
NAMES = [*ORDINARY, *ORDINARY, *ORDINARY, "dims", "month", "unknown"]
SUBJECTS = ["org-1", "org-2", "user-é"]

charge = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(NAMES), st.integers(1, 3))
event = st.fixed_dictionaries(
    {
        # ids repeat, some with other charges (often: a few ids are drawn half the time)
        "id": st.integers(0, 60) | st.integers(0, 3),
        "charges": st.one_of(
            st.lists(charge, min_size=1, max_size=1),
            st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        ),
        # past the lateness (a day) and too far in the future, now and then
        "offset_seconds": st.sampled_from([0, 0, 0, 0, 0, 0, -5, -700, -1900, -90_000, 400]),
        # "raise" as `consume` asks: a decided id answers before the time is judged
        "invalid": st.sampled_from(["reject", "reject", "raise"]),
        "metadata": st.sampled_from([None, {"route": "/a"}]),
        "advance_seconds": st.sampled_from([0, 0, 1, 3, 7, 61, 700, 1900]),
    }
)
step = st.fixed_dictionaries(
    {
        "events": st.lists(event, min_size=1, max_size=10),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(["cal", "fu", "bucket", "units"]),
                st.one_of(st.none(), st.integers(1, 9)),
                st.sampled_from([0, -600]),
            ),
            max_size=1,
        ),
        "grants": st.lists(
            st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(GRANTABLE), st.integers(1, 4)),
            max_size=1,
        ).filter(lambda found: not found or found[0][0] == "org-2"),
    }
)
streams = st.lists(step, min_size=1, max_size=4)


def _stored(meter: Meter) -> dict[str, object]:
    with meter.engine.connect() as connection:

        def rows(query: Any) -> list[tuple[object, ...]]:
            return sorted(tuple(r) for r in connection.execute(query))

        state = [c for c in counters.c if c.name != "updated_at_us"]
        return {
            "results": rows(select(results)),
            "counters": rows(select(*state)),
            "windows": rows(select(current_windows)),
            "rollups": rows(select(usage_rollups)),
            "marks": rows(select(*[c for c in webhook_marks.c if c.name != "created_at_us"])),
            "messages": rows(select(webhook_messages.c.type, webhook_messages.c.payload)),
            "rejected": rows(select(rejected_messages.c.digest, rejected_messages.c.event_id)),
            "grants": rows(select(grants)),
            "draws": rows(select(grant_draws)),
        }


class _Counted:
    """What `_count` reports (`count_events`), per call, while active."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(tuple(dict(a) if isinstance(a, dict) else a for a in args))


def _run(urls: tuple[str, str, str], stream: list[dict[str, Any]], seen: list[int]) -> None:
    clock = FrozenClock(START)
    with ExitStack() as stack:
        one, old, reference = (stack.enter_context(Meter(url, clock=clock)) for url in urls)
        old._engine.one_trip = False
        for meter in (one, old, reference):
            meter.set_limits(LIMITS)
        one.database.run(one._engine.limits.refresh)  # a warm process: limits cached
        decided: set[str] = set()
        for number, spec in enumerate(stream):
            for meter in (one, old, reference):
                _allowances(meter, spec, clock(), number)
            for item in spec["events"]:
                clock.advance(seconds=item["advance_seconds"])
                when = clock() + timedelta(seconds=item["offset_seconds"])
                record = make_event(
                    item["charges"], when, f"ev-{item['id']}", item["metadata"]
                ).record()
                invalid = item["invalid"]
                counted = [_Counted(), _Counted()]
                answers = []
                for meter, counter in zip((one, old), counted, strict=True):
                    original = core.count_events
                    core.count_events = counter  # type: ignore[assignment]
                    try:
                        answers.append(
                            _answer(partial(meter._engine.apply, [record], invalid=invalid))
                        )
                    finally:
                        core.count_events = original
                now_us = one.database.now_us()
                apply = reference._engine._apply_reference
                found = _answer(partial(apply, [record], now_us, invalid, ()))
                assert answers[0] == answers[1]
                assert _kind(answers[0]) == _kind(found)
                assert counted[0].calls == counted[1].calls
                if isinstance(found, tuple):  # only a new id is judged: a decided one answers
                    assert record.event_id not in decided, found
                elif record.event_id not in decided:  # the function declines a repeat: not counted
                    decided.add(record.event_id)
                    seen[0] += 1
        assert _stored(one) == _stored(reference)
        assert _stored(old) == _stored(reference)


def _answer(apply: Callable[[], list[Answer]]) -> list[Answer] | tuple[str, str, str]:
    """The engine's answers, or the error it raised (its type and message)."""
    try:
        return apply()
    except MeteringError as exc:
        return ("error", type(exc).__name__, str(exc))


def _kind(found: list[Answer] | tuple[str, str, str]) -> object:
    """An error as it is; answers by kind (new, duplicate, conflict) and outcome."""
    if isinstance(found, tuple):
        return found
    return [(kind, None if record is None else record.outcome) for kind, record in found]


def _allowances(meter: Meter, spec: dict[str, Any], now: datetime, number: int) -> None:
    for subject, limit, maximum, offset in spec["entitlements"]:
        meter.set_entitlement(
            subject, limit, maximum, effective_from=now + timedelta(seconds=offset)
        )
    for subject, limit, amount in spec["grants"]:
        meter.grant(
            subject, limit, amount, None, grant_id=f"g-{number}-{SUBJECTS.index(subject)}-{limit}"
        )


SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@contextmanager
def _databases(request: pytest.FixtureRequest, kind: str) -> Iterator[tuple[str, str, str]]:
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        with tempfile.TemporaryDirectory() as directory:
            yield tuple(copy_sqlite(template, Path(directory) / f"{n}.db") for n in "abc")  # type: ignore[misc]
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    template: str = request.getfixturevalue("pg_template_url")
    with contextlib.ExitStack() as copies:
        yield tuple(copies.enter_context(server.copy_of(template, "one_trip")) for _ in "abc")  # type: ignore[misc]


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "postgresql"])
def test_one_trip_path_matches_the_reference_engine(
    request: pytest.FixtureRequest, kind: str
) -> None:
    if kind == "postgresql":
        request.applymarker(pytest.mark.postgres)
    before = STATS.copy()
    seen = [0]

    @SETTINGS
    @given(stream=streams)
    def differential(stream: list[dict[str, Any]]) -> None:
        with _databases(request, kind) as urls:
            _run(urls, stream, seen)

    differential()
    applied = STATS["applied"] - before["applied"]
    if kind == "sqlite":
        assert applied == 0
    else:
        # Most single events are the function's: it really ran.
        assert applied >= seen[0] // 2, (applied, seen[0], STATS - before)


def test_an_ordinary_event_takes_one_trip(pg_url: str) -> None:
    """Calendar, first-use, bucket and stacked events: the function decides each."""
    clock = FrozenClock(START)
    with Meter(pg_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.consume("org-1", "cal")  # caches the limits
        before = STATS["applied"]
        for name in ["cal", "fu", "bucket", "soft", "units"]:
            assert meter.consume("org-2", name).allowed
        assert meter.consume(charges=[("org-2", "cal", 1), ("org-2", "fu", 1)]).allowed
        assert STATS["applied"] - before == 6


def _hammer(url: str, index: int, calls: int, queue: Any) -> None:
    allowed = 0
    STATS.clear()
    with Meter(url) as meter:
        meter._engine.one_trip = index != 3  # one process on the old path alongside
        stacked = [("shared", "hard", 1), ("shared", "wide", 1)]
        for _ in range(calls):
            allowed += meter.consume(charges=stacked).allowed
    queue.put((index, allowed, STATS["applied"]))


def test_processes_consuming_one_hard_limit_get_exactly_the_maximum(pg_url: str) -> None:
    """Four processes (one of them on the old path) charge one hard limit and
    a first-use limit stacked: exactly the maximum is allowed, all or nothing,
    and the counters equal the ledger."""
    with Meter(pg_url) as meter:
        meter.set_limits(
            [
                Limit("hard", maximum=150, period="1d", window="calendar"),
                Limit("wide", maximum=10**6, period="1d"),
            ]
        )
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [
        context.Process(target=_hammer, args=(pg_url, index, 60, queue)) for index in range(4)
    ]
    for process in processes:
        process.start()
    found = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert sum(allowed for _, allowed, _ in found) == 150
    assert sum(applied for _, _, applied in found) >= 120  # the function decided most
    with Meter(pg_url) as meter, meter.engine.connect() as connection:
        used = dict(
            connection.execute(
                select(counters.c.limit_name, func.sum(counters.c.used)).group_by(
                    counters.c.limit_name
                )
            ).all()
        )
        ledger = connection.execute(
            select(func.count()).select_from(results).where(results.c.outcome == "allowed")
        ).scalar_one()
    assert used == {"hard": 150, "wide": 150}
    assert ledger == 150
