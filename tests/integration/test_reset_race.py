"""An operator's reset under traffic clears every counter of its scope.

Two processes of three threads charge one subject a unit at a time while resets of that
subject run, on PostgreSQL and SQLite. Each allowed charge's result records the counter
after it, so every window the resets started shows in the ledger as a run
1, 2, 3 ...: as many 1s as resets plus one. Voids afterwards give back
exactly what is still counted, event by event, every one of them: those an
event decided before a reset but written after it (it waited for the
reset's lock) included. The clock runs (from a fixed instant).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import Limit, Meter
from metering.domain.decisions import ChargeDecision
from metering.storage.tables import results

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
CONSUMERS = 2
THREADS = 3
RESETS = 12
CHARGES_BETWEEN_RESETS = 20
WAIT_SECONDS = 60.0

pytestmark = pytest.mark.slow


def _clock(origin: float) -> Callable[[], datetime]:
    """NOW plus the seconds since ``origin``: one running clock in every process."""
    return lambda: NOW + timedelta(seconds=time.time() - origin)


def _consume(url: str, worker: int, origin: float, stop: multiprocessing.synchronize.Event) -> None:
    """``THREADS`` threads charging org-1 (and now and then org-2) until told to stop."""
    with Meter(url, clock=_clock(origin)) as meter:

        def charge(thread: int) -> None:
            n = 0
            while not stop.is_set():
                meter.consume("org-1", "calls", event_id=f"w{worker}-{thread}-{n}")
                if n % 10 == 0:
                    meter.consume("org-2", "calls", event_id=f"w{worker}-{thread}-other-{n}")
                n += 1

        threads = [threading.Thread(target=charge, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _allowed(meter: Meter, subject: str) -> list[ChargeDecision]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(results.c.outcome, results.c.charges))
        charges = [ChargeDecision.from_row(json.loads(c)[0]) for o, c in rows if o == "allowed"]
    return [charge for charge in charges if charge.subject == subject]


def _allowed_ids(meter: Meter) -> list[str]:
    """The allowed events of org-1 not voided yet."""
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(
            select(results.c.event_id, results.c.charges).where(results.c.outcome == "allowed")
        )
        return [
            event_id
            for event_id, charges in rows
            if json.loads(charges)[0][0] == "org-1" and event_id not in {"before", "after"}
        ]


def _used(meter: Meter, subject: str) -> int:
    return sum(counter.used for counter in meter.counters(subject, "calls"))


def _after_some_traffic(meter: Meter) -> None:
    """Until the consumers have charged org-1 a few times since the last reset."""
    deadline = time.monotonic() + WAIT_SECONDS
    while _used(meter, "org-1") < CHARGES_BETWEEN_RESETS:
        assert time.monotonic() < deadline, "the consumers charged nothing"
        time.sleep(0.01)


def _reset_under_traffic(url: str, meter: Meter, origin: float) -> list[int]:
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    procs = [
        context.Process(target=_consume, args=(url, n, origin, stop)) for n in range(CONSUMERS)
    ]
    for proc in procs:
        proc.start()
    cleared = []
    try:
        for _ in range(RESETS):
            _after_some_traffic(meter)
            cleared.append(meter.reset(subject="org-1"))
        _after_some_traffic(meter)
    finally:
        stop.set()
        for proc in procs:
            proc.join(WAIT_SECONDS)
    assert [proc.exitcode for proc in procs] == [0] * CONSUMERS
    return cleared


def test_every_reset_under_traffic_clears_and_voids_give_back_what_is_counted(
    db_url: str,
) -> None:
    origin = time.time()
    with Meter(db_url, clock=_clock(origin)) as meter:
        meter.set_limit(Limit("calls", maximum=10**9, period="1d", window="calendar"))
        meter.consume("org-1", "calls", event_id="before")
        cleared = _reset_under_traffic(db_url, meter, origin)
        assert cleared == [1] * RESETS  # every reset cleared org-1's one counter

        runs = Tally(charge.used for charge in _allowed(meter, "org-1"))
        assert runs[1] == RESETS + 1  # each reset started a window from zero
        assert all(runs[n] >= runs[n + 1] for n in range(1, max(runs)))
        counted = _used(meter, "org-1")
        assert runs[counted] > runs[counted + 1]  # the counter ends a run of the ledger
        assert _used(meter, "org-2") == len(_allowed(meter, "org-2"))  # out of the scope

        assert meter.void("before", "refund").charges == ()  # a reset cleared it
        assert meter.consume("org-1", "calls", event_id="after").allowed
        assert [c[2] for c in meter.void("after", "refund").charges] == [1]
        assert _used(meter, "org-1") == counted
        assert [c[2] for c in meter.void("w0-0-other-0", "refund").charges] == [1]
        assert _used(meter, "org-2") == len(_allowed(meter, "org-2")) - 1

        # Every event voided: the resets' share gives nothing back, the
        # rest exactly what the counter still bills, whatever the clocks.
        gave = [len(meter.void(event_id, "refund").charges) for event_id in _allowed_ids(meter)]
        assert _used(meter, "org-1") == 0
        assert sum(gave) == counted
