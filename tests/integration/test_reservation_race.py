"""Processes reserving against one limit while half of them cancel."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import time
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter

PROCESSES = 8
ATTEMPTS = 150
MAXIMUM = 100
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.slow


def _reserve_many(
    url: str,
    worker: int,
    ready: multiprocessing.synchronize.Semaphore,
    start: multiprocessing.synchronize.Event,
    tally: object,
) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    committed = cancelled = 0
    # A canceller holds one unit before the race, so that cancels happen
    # whichever process the scheduler favours; it gives it back first thing.
    first = meter.reserve("tenant-1", "jobs", event_id=f"w{worker}-first")
    ready.release()
    start.wait(30)
    if worker % 2 == 0:
        first.cancel()
        cancelled += 1
    else:
        first.commit()
        committed += 1
    for n in range(ATTEMPTS):
        reservation = meter.reserve("tenant-1", "jobs", event_id=f"w{worker}-{n}")
        if not reservation.allowed:
            continue
        if worker % 2 == 0:
            reservation.cancel()
            cancelled += 1
        else:
            reservation.commit()
            committed += 1
    tally.put((committed, cancelled))  # type: ignore[attr-defined]
    meter.close()


def test_held_never_exceeds_the_limit_and_the_counter_equals_commits(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("jobs", maximum=MAXIMUM, period="1d", window="calendar"))
    context = multiprocessing.get_context("fork")
    ready, start, tally = context.Semaphore(0), context.Event(), context.Queue()
    procs = [
        context.Process(target=_reserve_many, args=(db_url, n, ready, start, tally))
        for n in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        assert ready.acquire(timeout=60)
    # Sample what is held (reserved and not given back) while they race. The
    # watcher is open before the start: on SQLite's direct path the race can
    # be over before a new Meter would have read once.
    highest = 0
    with Meter(db_url, clock=FrozenClock(NOW)) as watcher:
        start.set()
        while True:
            alive = any(proc.is_alive() for proc in procs)
            highest = max([highest, *(c.used for c in watcher.counters("tenant-1", "jobs"))])
            if not alive:
                break
            time.sleep(0.005)
        for proc in procs:
            proc.join(240)
        assert [proc.exitcode for proc in procs] == [0] * PROCESSES
        results = [tally.get(timeout=10) for _ in procs]
        committed = sum(c for c, _ in results)
        cancelled = sum(c for _, c in results)
        [counter] = watcher.counters("tenant-1", "jobs")
        states = {r.state for r in watcher.reservations(count=2000)}
        held = len(watcher.reservations(state="held", count=2000))
    assert 0 < highest <= MAXIMUM
    assert cancelled > 0 and committed > 0
    assert counter.used == committed <= MAXIMUM
    assert held == 0 and states == {"committed", "cancelled"}
