"""No lost updates: processes racing on one counter never exceed a hard limit."""

from __future__ import annotations

import multiprocessing
from collections import Counter as Tally
from datetime import UTC, datetime

import pytest
from servers import PostgresServer
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.storage.tables import results

PROCESSES = 8
CALLS = 500
MAXIMUM = 1000
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.slow


def _consume_many(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    start.wait(30)
    for n in range(CALLS):
        meter.consume("org-1", "calls", event_id=f"w{worker}-{n}")
    meter.close()


def _race(url: str) -> None:
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_consume_many, args=(url, n, start)) for n in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES


def test_racing_processes_never_exceed_a_hard_limit(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=MAXIMUM, period="1d", window="calendar"))
    _race(db_url)
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        [counter] = meter.counters("org-1", "calls")
        with meter.sql_engine.connect() as connection:
            outcomes = Tally(connection.execute(select(results.c.outcome)).scalars())
    assert outcomes == {"allowed": MAXIMUM, "denied": PROCESSES * CALLS - MAXIMUM}
    assert counter.used == MAXIMUM
    assert counter.denied_count == PROCESSES * CALLS - MAXIMUM


# -- an operator's reset racing consume ----------------------------------------

RESET_SUBJECTS = [f"org-{n}" for n in range(4)]


def _consume_stacked(url: str, worker: int, start: multiprocessing.synchronize.Event) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    start.wait(30)
    for n in range(300):
        # Two subjects and two limits per event, in varying order: a reset of
        # one of them must never deadlock with it.
        a, b = RESET_SUBJECTS[n % 4], RESET_SUBJECTS[(n + worker + 1) % 4]
        charges = [(a, "per_hour", 1), (b, "per_day", 1)]
        meter.consume(charges=charges if n % 2 else charges[::-1], event_id=f"s{worker}-{n}")
    meter.close()


def _reset_often(url: str, start: multiprocessing.synchronize.Event) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    start.wait(30)
    for n in range(150):
        if n % 3 == 0:
            meter.reset(limit="per_day")
        else:
            meter.reset(subject=RESET_SUBJECTS[n % 4])
    meter.close()


def _deadlocks(url: str) -> int:
    with Meter(url) as meter, meter.sql_engine.connect() as connection:
        query = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        return int(connection.exec_driver_sql(query).scalar_one())


def test_a_reset_racing_consume_never_deadlocks(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("per_hour", maximum=10**6, period="1h"),
                Limit("per_day", maximum=10**6, period="1d"),
            ]
        )
    before = _deadlocks(pg_url)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_consume_stacked, args=(pg_url, n, start)) for n in range(3)]
    procs.append(context.Process(target=_reset_often, args=(pg_url, start)))
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(240)
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    # Every backend has exited, so its statistics are flushed.
    assert _deadlocks(pg_url) - before == 0, postgres_server.log_tail(200)
