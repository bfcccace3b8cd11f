"""Usage rollups stay exact when processes apply events for one subject at once.

Five processes race on one subject: stacked charges of two limits with
dimensions (in varying order), single events (`consume`) and batches
(`apply`, the worker's path), events in three hours, a hard limit that
starts denying midway. Afterwards the group-by report must equal what the
stored results say was consumed, and PostgreSQL must have seen no deadlock.
"""

from __future__ import annotations

import multiprocessing
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.reports import usage_by_dimension_report
from metering.storage.results import record_from_row
from metering.storage.tables import results

PROCESSES = 5
EVENTS = 120
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ROUTES = ["/a", "/b", "/c", None]
LIMITS = [
    Limit("calls", maximum=300, period="1d", window="calendar", dimensions=("route", "model")),
    Limit(
        "org",
        maximum=10**6,
        period="1h",
        window="calendar",
        enforcement="soft",
        dimensions=("route",),
    ),
]

pytestmark = pytest.mark.slow


def _apply_many(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    start.wait(30)
    batch = []
    for n in range(EVENTS):
        route = ROUTES[(n + worker) % len(ROUTES)]
        metadata = {"route": route, "model": f"m{n % 2}"} if route else None
        charges = [("org-1", "calls", 1 + n % 3), ("org-1", "org", 1)]
        charges = charges if (n + worker) % 2 else charges[::-1]
        when = NOW - timedelta(minutes=(n * 7) % 150)  # three hours
        if worker % 2:
            meter.consume(
                charges=charges, metadata=metadata, occurred_at=when, event_id=f"w{worker}-{n}"
            )
            continue
        batch.append(make_event(charges, when, f"w{worker}-{n}", metadata))
        if len(batch) == 8:
            meter.apply(batch)
            batch = []
    if batch:
        meter.apply(batch)
    meter.close()


def _expected(meter: Meter, key: str) -> dict[tuple[str, str | None], tuple[int, int]]:
    sums: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])
    with meter.sql_engine.connect() as connection:
        for row in connection.execute(select(results)):
            record = record_from_row(tuple(row))
            if record.outcome not in ("allowed", "overage"):
                continue
            value = (record.metadata or {}).get(key)
            for charge in record.charges:
                if key == "model" and charge[1] != "calls":
                    continue
                figures = sums[(charge[1], value)]
                figures[0] += charge[2]
                figures[1] += 1
    return {k: (used, events) for k, (used, events) in sums.items()}


def _deadlocks(meter: Meter) -> int:
    if meter.sql_engine.dialect.name != "postgresql":
        return 0
    query = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    with meter.sql_engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())


def test_racing_processes_keep_rollups_exact(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(LIMITS)
        before = _deadlocks(meter)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_apply_many, args=(db_url, n, start)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        assert meter.count_results() == PROCESSES * EVENTS
        outcomes = meter.outcome_counts()
        assert outcomes.get("denied", 0) > 0  # the hard limit was reached
        for key in ("route", "model"):
            rows = usage_by_dimension_report(meter, subject="org-1", key=key)
            got = {(r.limit, r.value): (r.used, r.events) for r in rows}
            assert got == _expected(meter, key), key
        [calls] = [c for c in meter.counters("org-1", "calls")]
        by_route = usage_by_dimension_report(meter, subject="org-1", key="route", limit="calls")
        assert sum(r.used for r in by_route) == calls.used <= 300
        assert _deadlocks(meter) - before == 0
