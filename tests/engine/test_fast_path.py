"""The hot path and the general engine agree, on SQLite and on PostgreSQL.

`Meter.apply` runs the lean rules (`metering.engine.fast`); the general engine
(`metering.engine.reference.apply_events`, as `Engine._apply_reference` runs it) states
the same rules with value objects. Hypothesis drives both, each on its own
database, with the same random stream of batches: stacked charges, first-use
and calendar windows, token buckets, soft limits with thresholds, denials,
ids repeated inside a batch and across batches (some with other charges,
some past their lateness: a decided id answers first), late and future
events, unknown limits, a limit changed between batches, subjects' own
maximums changed (some effective in the past, inside the
current window), grants (some expiring mid-stream, some recurring, with
priorities and grant.low), subjects' own thresholds, a shadow limit, and
limits with dimensions with events with and without their metadata keys.
Results rows, counters, grants and their draws, usage rollups,
notification marks and
messages, and rejected messages must be identical.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import UsageEvent, make_event
from metering.metrics import metrics
from metering.storage.tables import (
    counters,
    entitlements,
    grant_draws,
    grant_schedules,
    grants,
    rejected_messages,
    results,
    usage_rollups,
    webhook_marks,
    webhook_messages,
)

START = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # a month's end is near
LIMITS = [
    Limit(
        "cal",
        maximum=5,
        period="1h",
        window="calendar",
        thresholds=(50, 100),
        dimensions=("route",),
    ),
    Limit("fu", maximum=4, period="30m"),
    Limit(
        "soft",
        maximum=3,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(80,),
        dimensions=("route", "model"),
    ),
    Limit(
        "bucket",
        maximum=3,
        period="60s",
        algorithm="token_bucket",
        thresholds=(100,),
        dimensions=("model",),
    ),
    Limit(
        "shadow",
        maximum=3,
        period="1h",
        window="calendar",
        enforcement="shadow",
        dimensions=("route",),
    ),
    Limit("units", maximum=6, period="30m", thresholds_units=(2, 5, 9)),
]
GRANTABLE = ["cal", "fu", "soft", "shadow", "units"]
NAMES = [limit.name for limit in LIMITS] + ["unknown"]
SUBJECTS = ["org-1", "org-2", "user-é"]

charge = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(NAMES), st.integers(1, 4))
event = st.fixed_dictionaries(
    {
        "id": st.integers(0, 40),  # small: ids repeat across and inside batches
        "charges": st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
        # -90,000: past every limit's lateness (a day), as 30 h ahead is past the future's
        "offset_seconds": st.sampled_from([0, -30, -700, -1900, -4000, -90_000, 3600 * 30, 600]),
        "metadata": st.sampled_from([None, {"route": "/a"}, {"route": "/b", "model": 2}]),
    }
)
batch = st.fixed_dictionaries(
    {
        "advance_seconds": st.sampled_from([0, 20, 61, 900, 1900, 3600]),
        "events": st.lists(event, min_size=1, max_size=12),
        "new_cal_maximum": st.one_of(st.none(), st.integers(1, 8)),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from([*GRANTABLE, "bucket"]),
                st.one_of(st.none(), st.integers(1, 9)),
                st.sampled_from([0, -600, -3000]),  # effective from: now, or earlier
            ),
            max_size=2,
        ),
        "grants": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(GRANTABLE),
                st.integers(1, 5),
                st.sampled_from([None, 60, 1000, 5000]),  # expires after: never, or seconds
                st.sampled_from([50, 100, 150]),  # priority (issue 22)
                st.sampled_from([None, None, 1, "50%"]),  # grant.low at
                st.sampled_from([None, None, "1h"]),  # recurring (then no expiry)
            ),
            max_size=2,
        ),
        # A subject's own thresholds (issue 22).
        "alerts": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from([*GRANTABLE, "bucket"]),
                st.sampled_from([["50%"], ["1", "90%"]]),
            ),
            max_size=1,
        ),
    }
)
streams = st.lists(batch, min_size=1, max_size=6)


def _events(spec: dict[str, object], now: datetime) -> list[UsageEvent]:
    made = []
    for item in spec["events"]:  # type: ignore[attr-defined]
        when = now + timedelta(seconds=item["offset_seconds"])
        made.append(make_event(item["charges"], when, f"ev-{item['id']}", item["metadata"]))
    return made


def _stored(meter: Meter) -> dict[str, object]:
    with meter.engine.connect() as connection:

        def rows(query: object) -> list[tuple[object, ...]]:
            return sorted(tuple(r) for r in connection.execute(query))  # type: ignore[call-overload]

        state = [c for c in counters.c if c.name != "updated_at_us"]
        return {
            "results": rows(select(results)),
            "counters": rows(select(*state)),
            "rollups": rows(select(usage_rollups)),
            "marks": rows(select(*[c for c in webhook_marks.c if c.name != "created_at_us"])),
            "messages": rows(select(webhook_messages.c.type, webhook_messages.c.payload)),
            "rejected": rows(select(rejected_messages.c.digest, rejected_messages.c.event_id)),
            "grants": rows(select(grants)),
            "draws": rows(select(grant_draws)),
            "entitlements": rows(select(entitlements)),
            "schedules": rows(select(grant_schedules)),
        }


def _run(fast_url: str, general_url: str, stream: list[dict[str, object]]) -> None:
    clock = FrozenClock(START)
    with Meter(fast_url, clock=clock) as fast, Meter(general_url, clock=clock) as general:
        fast.set_limits(LIMITS)
        general.set_limits(LIMITS)
        for number, spec in enumerate(stream):
            clock.advance(seconds=spec["advance_seconds"])  # type: ignore[arg-type]
            maximum = spec["new_cal_maximum"]
            if isinstance(maximum, int):
                changed = Limit(
                    "cal", maximum=maximum, period="1h", window="calendar", dimensions=("route",)
                )
                fast.set_limit(changed)
                general.set_limit(changed)
            for meter in (fast, general):
                _allowances(meter, spec, clock(), number)
            events = _events(spec, clock())
            records = [e.record() for e in events]
            before = _reference_decisions()
            fast.apply_records(records, invalid="reject")
            if not _first_use_charged(spec):
                # Grants, recurring grants' issues, grant.low and own thresholds included.
                assert _reference_decisions() == before, "the fast path left the batch"
            general._engine._apply_reference(records, fast.database.now_us(), "reject", ())
        assert _stored(fast) == _stored(general)


# The limits whose events may fall back to the reference engine: an event
# before its subject's current first-use window.
FIRST_USE = {"fu", "units"}


def _first_use_charged(spec: dict[str, object]) -> bool:
    items = spec["events"]
    return any(c[1] in FIRST_USE for item in items for c in item["charges"])  # type: ignore[attr-defined]


def _reference_decisions() -> float:
    found = metrics().registry.get_sample_value(
        "metering_reference_events_total", {"path": "apply"}
    )
    return found or 0.0


def _allowances(meter: Meter, spec: dict[str, object], now: datetime, number: int) -> None:
    for subject, limit, maximum, offset in spec["entitlements"]:  # type: ignore[attr-defined]
        when = now + timedelta(seconds=offset)
        meter.set_entitlement(subject, limit, maximum, effective_from=when)
    grants = spec["grants"]
    for index, grant in enumerate(grants):  # type: ignore[arg-type]
        subject, limit, amount, expires, priority, low, every = grant
        expires_at = None if expires is None or every else now + timedelta(seconds=expires)
        meter.grant(
            subject,
            limit,
            amount,
            expires_at,
            grant_id=f"g-{now.timestamp():.0f}-{number}-{index}",
            priority=priority,
            low=low,
            every=every,
        )
    for subject, limit, at in spec["alerts"]:  # type: ignore[attr-defined]
        meter.set_alert(subject, limit, at)


SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.slow
@SETTINGS
@given(stream=streams)
def test_sqlite_hot_path_matches_the_general_engine(
    sqlite_template: Path, stream: list[dict[str, object]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        fast = copy_sqlite(sqlite_template, base / "fast.db")
        _run(fast, copy_sqlite(sqlite_template, base / "general.db"), stream)


@contextmanager
def _two_databases(server: PostgresServer, template: str) -> Iterator[tuple[str, str]]:
    with server.copy_of(template, "diff") as fast, server.copy_of(template, "diff") as general:
        yield fast, general


@pytest.mark.postgres
@settings(SETTINGS, max_examples=25)
@given(stream=streams)
def test_postgresql_hot_path_matches_the_general_engine(
    postgres_server: PostgresServer, pg_template_url: str, stream: list[dict[str, object]]
) -> None:
    with _two_databases(postgres_server, pg_template_url) as (fast_url, general_url):
        _run(fast_url, general_url, stream)


def test_the_hot_path_runs_for_ordinary_batches(sqlite_url: str) -> None:
    """Not every batch falls back: an ordinary one never reaches the general engine."""
    clock = FrozenClock(START)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limits(LIMITS)

        def refuse(*_args: object) -> None:
            raise AssertionError("the general engine ran")

        meter._engine._apply_reference = refuse  # type: ignore[method-assign]
        events = [make_event([(s, "fu", 1), (s, "cal", 1)], clock()) for s in SUBJECTS]
        answers = meter.apply_records([e.record() for e in events])
        assert [kind for kind, _ in answers] == ["new"] * len(SUBJECTS)


def _tighten(url: str) -> None:
    with Meter(url, clock=FrozenClock(START)) as other:
        other.set_limit(Limit("cal", maximum=1, period="1h", window="calendar"))


def test_a_limit_changed_in_another_process_applies_to_the_next_decision(db_url: str) -> None:
    import multiprocessing

    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        assert meter.consume("org-1", "cal").allowed  # the limits are now cached here
        process = multiprocessing.get_context("fork").Process(target=_tighten, args=(db_url,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        decision = meter.consume("org-1", "cal")
        assert (decision.outcome, decision.maximum) == ("denied", 1)


def test_a_repeat_of_a_stored_id_is_judged_against_the_stored_result(sqlite_url: str) -> None:
    """ev-0 is stored; a batch reuses it with other charges, then with the stored ones."""
    clock = FrozenClock(START)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        meter.apply([make_event([("org-2", "cal", 1)], clock(), "ev-0")])
        batch = [
            make_event([("org-1", "cal", 1)], clock(), "ev-0"),
            make_event([("org-2", "cal", 1)], clock(), "ev-0"),
        ]
        answers = meter.apply_records([e.record() for e in batch])
        assert [kind for kind, _ in answers] == ["conflict", "duplicate"]
