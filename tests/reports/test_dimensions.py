"""Usage by dimension: the report against a plain-Python model of the decisions.

Hypothesis draws events (two subjects, limits with and without dimensions,
stacked charges, a hard limit that denies, metadata with and without the
keys, values that are numbers, booleans or too long) spread over several
hours, and applies them through `Meter.consume` one by one or through
`Meter.apply` in batches (the worker's path), on SQLite and PostgreSQL. The
model sums what the decisions say was consumed; the report must give the
same figures, in the same order, for every key and for an hour-aligned
sub-period.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from budgets import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import PostgresServer, copy_sqlite

from metering import FrozenClock, Limit, Meter
from metering.domain.decisions import Decision
from metering.domain.events import make_event
from metering.errors import InvalidInput, UnknownLimit
from metering.reports import DimensionRow, usage_by_dimension, usage_by_dimension_report

START = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)  # a month's end is near
LIMITS = [
    Limit("api", maximum=6, period="1h", window="calendar", dimensions=("route", "model")),
    Limit(
        "soft",
        maximum=3,
        period="1mo",
        window="calendar",
        enforcement="soft",
        dimensions=("route",),
    ),
    Limit("plain", maximum=4, period="30m"),
]
DIMENSIONS = {limit.name: limit.dimensions for limit in LIMITS}
SUBJECTS = ["org-1", "org-2"]
LONG = "r" * 250
METADATA = [
    None,
    {},
    {"route": "/a"},
    {"route": "/b", "model": "m1"},
    {"route": 7, "model": True},
    {"route": None, "model": [1, "x"]},
    {"route": LONG},
    {"route": "", "other": "z"},
]
_databases = itertools.count(1)

charge = st.tuples(
    st.sampled_from(SUBJECTS), st.sampled_from([lim.name for lim in LIMITS]), st.integers(1, 3)
)
event = st.fixed_dictionaries(
    {
        "charges": st.lists(charge, min_size=1, max_size=2, unique_by=lambda c: c[:2]),
        "metadata": st.sampled_from(METADATA),
        "advance_minutes": st.sampled_from([0, 7, 25, 61]),
    }
)
scenario = st.fixed_dictionaries(
    {
        "events": st.lists(event, min_size=1, max_size=25),
        "batch": st.integers(1, 6),  # 1: `consume` one by one; more: `apply` in batches
    }
)


# -- the model ------------------------------------------------------------------


def model_value(metadata: dict[str, Any] | None, key: str) -> str | None:
    """The documented placeholder rule, written out again."""
    value = (metadata or {}).get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        value = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return value[:200]


def model(
    decisions: list[tuple[Decision, dict[str, Any] | None]],
    subject: str,
    key: str,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[tuple[str, str | None, int, int]]:
    sums: dict[tuple[str, str | None], list[int]] = {}
    for decision, metadata in decisions:
        if decision.outcome not in ("allowed", "overage"):
            continue
        hour = decision.occurred_at.replace(minute=0, second=0, microsecond=0)
        if (since is not None and hour < since) or (until is not None and hour >= until):
            continue
        for charge in decision.charges:
            if charge.subject != subject or key not in DIMENSIONS[charge.limit]:
                continue
            figures = sums.setdefault((charge.limit, model_value(metadata, key)), [0, 0])
            figures[0] += charge.cost
            figures[1] += 1
    rows = [(limit, value, used, events) for (limit, value), (used, events) in sums.items()]
    return sorted(rows, key=lambda r: (-r[2], -r[3], r[0], r[1] or ""))


def figures(rows: list[DimensionRow]) -> list[tuple[str, str | None, int, int]]:
    return [(r.limit, r.value, r.used, r.events) for r in rows]


# -- applying ---------------------------------------------------------------------


def apply(meter: Meter, clock: FrozenClock, spec: dict[str, Any]) -> list[Any]:
    """Apply the scenario; (decision, metadata) per event."""
    decided: list[tuple[Decision, dict[str, Any] | None]] = []
    pending: list[tuple[Any, dict[str, Any] | None]] = []

    def flush() -> None:
        applied = meter.apply([e for e, _ in pending])
        for (_, metadata), decision in zip(pending, applied, strict=True):
            assert isinstance(decision, Decision)
            decided.append((decision, metadata))
        pending.clear()

    for n, item in enumerate(spec["events"]):
        clock.advance(minutes=item["advance_minutes"])
        if spec["batch"] == 1:
            decision = meter.consume(
                charges=item["charges"], metadata=item["metadata"], event_id=f"e{n}"
            )
            decided.append((decision, item["metadata"]))
            continue
        made = make_event(item["charges"], clock(), f"e{n}", item["metadata"])
        pending.append((made, item["metadata"]))
        if len(pending) == spec["batch"]:
            flush()
    if pending:
        flush()
    return decided


def check(url: str, spec: dict[str, Any]) -> None:
    clock = FrozenClock(START)
    with Meter(url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        decided = apply(meter, clock, spec)
        for subject, key in itertools.product(SUBJECTS, ("route", "model")):
            got = usage_by_dimension_report(meter, subject=subject, key=key)
            assert figures(got) == model(decided, subject, key), (subject, key)
            assert all((r.subject, r.dimension) == (subject, key) for r in got)
        since, until = START + timedelta(hours=1), START + timedelta(hours=3)
        got = usage_by_dimension_report(
            meter, subject="org-1", key="route", limit="api", since=since, until=until
        )
        expected = [r for r in model(decided, "org-1", "route", since, until) if r[0] == "api"]
        assert figures(got) == expected


SETTINGS = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(spec=scenario)
def test_sqlite_report_matches_the_model(sqlite_template: Path, spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        check(copy_sqlite(sqlite_template, Path(directory) / "metering.db"), spec)


@pytest.mark.postgres
@settings(SETTINGS, max_examples=examples(20))
@given(spec=scenario)
def test_postgresql_report_matches_the_model(
    postgres_server: PostgresServer, pg_template_url: str, spec: dict[str, Any]
) -> None:
    with postgres_server.copy_of(pg_template_url, prefix="groupby") as url:
        check(url, spec)


# -- examples -----------------------------------------------------------------------


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as m:
        m.set_limits(LIMITS)
        yield m


def test_a_denied_stacked_event_counts_for_no_charge(meter: Meter) -> None:
    """`api`'s charge fits, `plain`'s does not: nothing is consumed, nothing rolled up."""
    meter.consume("org-1", "api", 1, metadata={"route": "/a"})
    denied = meter.consume(
        charges=[("org-1", "api", 1), ("org-1", "plain", 5)], metadata={"route": "/a"}
    )
    assert denied.outcome == "denied" and denied.charges[0].allowed
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("api", "/a", 1, 1)]


def test_limits_without_dimensions_write_no_rollups(meter: Meter) -> None:
    from sqlalchemy import func, select

    from metering.storage.tables import usage_rollup_deltas, usage_rollups

    for _ in range(3):
        meter.consume("org-1", "plain", metadata={"route": "/a"})
    meter.apply([make_event([("org-1", "plain", 1)], START, f"b-{i}") for i in range(2)])
    with meter.sql_engine.connect() as connection:
        for table in (usage_rollups, usage_rollup_deltas):
            assert connection.execute(select(func.count()).select_from(table)).scalar() == 0


def test_placeholders_and_the_periods(meter: Meter) -> None:
    meter.consume("org-1", "soft", 2, metadata={"route": LONG})
    meter.consume("org-1", "soft", 1, metadata={"route": 404})
    meter.consume("org-1", "soft", 1)
    rows = usage_by_dimension_report(meter, subject="org-1", key="route", period="2026-11")
    expected = [("soft", LONG[:200], 2, 1), ("soft", None, 1, 1), ("soft", "404", 1, 1)]
    assert figures(rows) == expected
    assert usage_by_dimension_report(meter, subject="org-1", key="route", period="2026-12") == []
    report = usage_by_dimension(meter, subject="org-1", key="route", since="2026-11-30T21:00")
    assert report.count() == 3 and len(list(report.rows())) == 3


@pytest.mark.parametrize(
    ("filters", "error", "field", "message"),
    [
        (
            {"key": "zone", "limit": "api"},
            InvalidInput,
            "group_by",
            "limit api does not record dimension 'zone'; it records route, model",
        ),
        ({"key": "zone"}, InvalidInput, "group_by", "no limit records dimension 'zone'"),
        ({"key": "route", "limit": "plain"}, InvalidInput, "group_by", "it records no dimension"),
        ({"key": ""}, InvalidInput, "group_by", "must be 1 to 64"),
        ({"key": "a b"}, InvalidInput, "group_by", "must be 1 to 64"),
        ({"key": "route", "since": "2026-11-01T10:30"}, InvalidInput, "since", "not on the hour"),
        ({"key": "route", "until": "2026-11-01T10:00:01"}, InvalidInput, "until", "on the hour"),
        ({"key": "route", "subject": ""}, InvalidInput, "subject", "."),
        ({"key": "route", "period": "2026-13"}, InvalidInput, "period", "not a month"),
        ({"key": "route", "limit": "nope"}, UnknownLimit, None, "nope"),
    ],
)
def test_bad_filters_raise_before_reading(
    meter: Meter, filters: dict[str, Any], error: type[Exception], field: str | None, message: str
) -> None:
    arguments = {"subject": "org-1", **filters}
    with pytest.raises(error, match=message) as raised:
        usage_by_dimension(meter, **arguments)
    if field is not None:
        assert getattr(raised.value, "field", None) == field


def test_negative_deltas_take_usage_away(meter: Meter) -> None:
    """What corrections will call: a voided event's rollups subtracted again."""
    from metering.domain.rollups import rollup_deltas
    from metering.storage.results import ResultRecord
    from metering.storage.rollups import record_rollups

    kept = meter.consume("org-1", "api", 2, metadata={"route": "/a"})
    voided = meter.consume("org-1", "api", 3, metadata={"route": "/b"})
    assert kept.allowed and voided.allowed
    stored = meter.result(voided.event_id)
    assert stored is not None
    record = ResultRecord(
        stored.event_id or "",
        stored.outcome,
        "",
        int(stored.occurred_at.timestamp() * 1e6),
        0,
        (),
        None,
        [c.to_row() for c in stored.charges],
        stored.metadata,
    )
    deltas = rollup_deltas([record], DIMENSIONS, sign=-1)
    with meter.sql_engine.begin() as connection:
        record_rollups(connection, deltas)
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("api", "/a", 2, 1)]  # /b sums to zero: left out


def test_reservations_count_and_a_cancel_takes_its_usage_back(meter: Meter) -> None:
    """A reservation consumes like consume; cancelling gives the cost back to the
    counter and to the rollups, so the report stays equal to the counters."""
    with meter.reserve("org-1", "api", 2, metadata={"route": "/kept"}):
        pass  # leaving the block commits
    held = meter.reserve("org-1", "api", 3, metadata={"route": "/cancelled"})
    assert held.allowed
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("api", "/cancelled", 3, 1), ("api", "/kept", 2, 1)]
    assert held.cancel() == 3
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("api", "/kept", 2, 1)]
    assert sum(r.used for r in rows) == sum(c.used for c in meter.counters("org-1", "api"))


def test_a_void_after_a_commit_of_less_takes_the_rest_from_the_rollups_once(
    meter: Meter,
) -> None:
    """A commit of less gives the rest back to the counter and the rollups;
    a void then takes back only what the event still had, so the rollups
    end at zero with the counter (one give-back: `metering.allowances.give_back`)."""
    held = meter.reserve("org-1", "api", 5, metadata={"route": "/r"})
    assert held.allowed and held.commit(actual=2) == 3
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("api", "/r", 2, 1)]
    meter.void(held.id, "refund")
    assert [c.used for c in meter.counters("org-1", "api")] == [0]
    assert usage_by_dimension_report(meter, subject="org-1", key="route") == []


def test_a_void_takes_its_event_off_though_no_unit_came_back(meter: Meter) -> None:
    """A seat event whose value keeps its seat (another live event holds it)
    gives back no unit when voided: it leaves the rows' ``events`` all the same."""
    meter.set_limits(
        [
            Limit(
                "seats", 5, period="1h", window="calendar", distinct="user", dimensions=("route",)
            ),
        ]
    )
    for event_id in ("e1", "e2"):
        meter.consume("org-1", "seats", event_id=event_id, metadata={"route": "/a", "user": "ann"})
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("seats", "/a", 1, 2)]
    meter.void("e1", "refund")  # ann keeps her seat: e2 is live
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) == [("seats", "/a", 1, 1)]
    meter.void("e2", "refund")  # her last live event: the seat goes
    rows = usage_by_dimension_report(meter, subject="org-1", key="route")
    assert figures(rows) in ([], [("seats", "/a", 0, 0)])


def test_a_partial_give_back_keeps_the_event() -> None:
    from metering.domain.rollups import given_back_deltas
    from metering.storage.results import ResultRecord

    event = ResultRecord("r", "allowed", "", 0, 0, (), None, [], {"route": "/a"})
    deltas = given_back_deltas(event, [("s", "api", 5, 2), ("s", "api", 1, 0)], DIMENSIONS)
    assert deltas == {
        ("s", "api", "route", 0, "/a"): (-2, 0),
        ("s", "api", "model", 0, ""): (-2, 0),
    }
    whole = given_back_deltas(event, [("s", "api", 5, 5)], DIMENSIONS)
    assert whole[("s", "api", "route", 0, "/a")] == (-5, -1)
