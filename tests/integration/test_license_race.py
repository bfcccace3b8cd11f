"""Floating licenses under processes: 8 racing for the last license, retries
of a checkout racing its checkin, and a holder killed with SIGKILL whose
license comes back at its TTL, once."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import CheckoutReleased

PROCESSES = 8
ROUNDS = 25
MAXIMUM = 3
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.slow


def _race(
    url: str,
    worker: int,
    ready: multiprocessing.synchronize.Semaphore,
    start: multiprocessing.synchronize.Event,
    tried: multiprocessing.synchronize.Barrier,
    tally: object,
) -> None:
    meter = Meter(url, clock=FrozenClock(NOW))
    meter.checkouts(count=1)  # connected and read before the start
    ready.release()
    start.wait(30)
    won = meter.checkout("org-1", "cad", checkout_id=f"last-{worker}").allowed
    tried.wait(60)  # every process has tried for the last license
    if won:
        assert meter.checkin(f"last-{worker}") == 1
    taken = 0
    for n in range(ROUNDS):  # then churn: check out and in, racing the others
        found = meter.checkout("org-1", "cad", checkout_id=f"w{worker}-{n}")
        if found.allowed:
            taken += 1
            assert meter.checkin(found.id) == 1
            assert meter.checkin(found.id) == 0
    tally.put((worker, won, taken))  # type: ignore[attr-defined]
    meter.close()


def test_eight_processes_race_for_the_last_license(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("cad", maximum=MAXIMUM, algorithm="concurrent"))
        for n in range(MAXIMUM - 1):
            assert meter.checkout("org-1", "cad", checkout_id=f"held-{n}").allowed
    context = multiprocessing.get_context("fork")
    ready, start, tally = context.Semaphore(0), context.Event(), context.Queue()
    tried = context.Barrier(PROCESSES)
    procs = [
        context.Process(target=_race, args=(db_url, n, ready, start, tried, tally))
        for n in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        assert ready.acquire(timeout=60)
    highest = 0
    with Meter(db_url, clock=FrozenClock(NOW)) as watcher:
        start.set()
        while True:
            alive = any(proc.is_alive() for proc in procs)
            held = watcher.checkouts("org-1", "cad", "held", count=1000)
            highest = max(highest, sum(c.cost for c in held))
            if not alive:
                break
            time.sleep(0.005)
        for proc in procs:
            proc.join(240)
        assert [proc.exitcode for proc in procs] == [0] * PROCESSES
        results = [tally.get(timeout=10) for _ in procs]
        held = watcher.checkouts("org-1", "cad", "held", count=1000)
    assert sum(won for _, won, _ in results) == 1  # one process got the last license
    assert sum(taken for _, _, taken in results) > 0  # the churn raced for it again
    assert highest <= MAXIMUM
    assert sorted(c.id for c in held) == ["held-0", "held-1"]


def _retry(
    url: str,
    start: multiprocessing.synchronize.Event,
    checked_in: multiprocessing.synchronize.Event,
    tally: object,
) -> None:
    """Retry ``job-1`` in a loop while it is checked in, then once after."""
    meter = Meter(url, clock=FrozenClock(NOW))
    meter.checkouts(count=1)  # connected and read before the start
    start.wait(30)
    try:
        answers = [_answer(meter) for _ in range(ROUNDS)]
        assert checked_in.wait(60)
        answers.append(_answer(meter))
    except AssertionError as exc:  # the test says why, not a timeout
        answers = [f"wrong answer: {exc}"]
    tally.put(answers)  # type: ignore[attr-defined]
    meter.close()


def _answer(meter: Meter) -> str:
    try:
        found = meter.checkout("org-1", "cad", checkout_id="job-1")
    except CheckoutReleased as ended:
        assert (ended.checkout_id, ended.released_by) == ("job-1", "checkin")
        return "ended"
    assert (found.state, found.allowed, found.held) == ("held", True, 1)
    return "held"


def test_retries_racing_the_checkin_answer_held_then_ended_never_allowed_after(
    db_url: str,
) -> None:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("cad", maximum=1, algorithm="concurrent"))
        assert meter.checkout("org-1", "cad", checkout_id="job-1").allowed
        context = multiprocessing.get_context("fork")
        start, checked_in, tally = context.Event(), context.Event(), context.Queue()
        procs = [
            context.Process(target=_retry, args=(db_url, start, checked_in, tally))
            for _ in range(4)
        ]
        for proc in procs:
            proc.start()
        start.set()
        assert meter.checkin("job-1") == 1  # while the retries run
        checked_in.set()
        results = [tally.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(60)
        assert [proc.exitcode for proc in procs] == [0] * len(procs)
        taken = meter.checkout("org-1", "cad", checkout_id="job-2")
        assert (taken.allowed, taken.held) == (True, 1)  # the license came back once
    for answers in results:  # held while held, then ended for good
        assert answers == sorted(answers, key=lambda answer: answer == "ended")
        assert answers[-1] == "ended"


HOLDER = """
import sys, time
from datetime import datetime, UTC
from metering import FrozenClock, Meter
meter = Meter(sys.argv[1], clock=FrozenClock(datetime.fromisoformat(sys.argv[2])))
found = meter.checkout("org-1", "cad", ttl_seconds=60, checkout_id="doomed")
print(found.state, flush=True)
time.sleep(600)
"""


def test_a_holder_killed_with_sigkill_gives_the_license_back_at_its_ttl_once(
    db_url: str,
) -> None:
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(Limit("cad", maximum=1, algorithm="concurrent"))
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, db_url, NOW.isoformat()],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
            if holder.stdout is not None:
                holder.stdout.close()
        assert holder.returncode == -signal.SIGKILL
        assert meter.checkout("org-2", "cad").allowed  # another subject: its own licenses
        clock.set(NOW + timedelta(seconds=59))
        denied = meter.checkout("org-1", "cad", checkout_id="early")
        assert not denied.allowed
        assert denied.retry_at == NOW + timedelta(seconds=60)
        clock.set(NOW + timedelta(seconds=60))
        assert meter.checkout("org-1", "cad", checkout_id="next").allowed
        assert not meter.checkout("org-1", "cad", checkout_id="third").allowed  # back once
        assert meter.checkin("doomed") == 0
        assert meter.sweep_reservations()["released"] == 0  # the checkin recorded the expiry
        info = meter.checkout_info("doomed")
        assert info is not None
        assert (info.state, info.released_by, info.released_at) == (
            "released",
            "expiry",
            NOW + timedelta(seconds=60),
        )
        held = meter.checkouts("org-1", "cad", "held")
        assert [c.id for c in held] == ["next"]
