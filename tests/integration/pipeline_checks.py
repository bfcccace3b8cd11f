"""What the pipeline tests of both harnesses share: waiting, streams, exact checks.

`test_pipeline.py` runs ``celery -A workers worker`` subprocesses
(conftest's `start_worker`); `test_inprocess_pipeline.py` runs a worker of
the same app in the test process. Both wait and check with these helpers;
a worker of either kind only has to tell its log (`Tailed`).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Protocol

import redis

from metering import Decision, Limit, Meter
from metering.engine.reference import decision_of
from metering.pipeline.producer import UsageProducer
from metering.pipeline.routing import DEFAULT_QUEUE
from metering.storage.connections import run_transaction
from metering.storage.store import Store

HUGE = 10**12
CALLS = Limit("calls", maximum=HUGE, period="1d", window="calendar")

RESULT_TIMEOUT = 120.0
POLL = 0.2


class Tailed(Protocol):
    """A worker whose last log lines go into a failure message."""

    def tail(self, lines: int = ...) -> str: ...


def tails(workers: Iterable[Tailed]) -> str:
    return "\n".join(worker.tail() for worker in workers)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: Callable[[], str],
    workers: Sequence[Tailed] = (),
    poll: float = POLL,
) -> None:
    """Poll ``condition`` until true; fail with ``what()`` and the worker logs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s: {what()}\n{tails(workers)}")
        time.sleep(poll)


def wait_for_results(
    meter: Meter, expected: int, workers: Sequence[Tailed], timeout: float = RESULT_TIMEOUT
) -> None:
    wait_until(
        lambda: meter.count_results() >= expected,
        timeout,
        lambda: f"{meter.count_results()} of {expected} results",
        workers,
    )


def decisions_of(meter: Meter, event_ids: Iterable[str]) -> dict[str, Decision]:
    """The stored decision of each of ``event_ids`` that has one."""
    records = run_transaction(meter.sql_engine, lambda c: Store(c).fetch_results(event_ids))
    return {event_id: decision_of(r, duplicate=False) for event_id, r in records.items()}


def used_by_subject(meter: Meter, limit: str) -> dict[str, int]:
    used: dict[str, int] = defaultdict(int)
    for counter in meter.counters(limit=limit):
        used[counter.subject] += counter.used
    return dict(used)


def cost_by_subject(events: Iterable[tuple[str, str, int]]) -> dict[str, int]:
    """Sum of costs per subject of (event id, subject, cost) rows."""
    total: dict[str, int] = defaultdict(int)
    for _, subject, cost in events:
        total[subject] += cost
    return dict(total)


def queue_state(client: redis.Redis) -> tuple[int, int]:
    """(messages waiting in the queue, messages taken by a worker and not acknowledged)."""
    return int(client.llen(DEFAULT_QUEUE)), int(client.hlen("unacked"))


def stream(
    redis_url: str, at: datetime, prefix: str, count: int, subjects: int, seed: int
) -> Iterable[tuple[str, str, int]]:
    """Emit ``count`` single-charge `calls` events in batches of 100, yielding each one."""
    rng = random.Random(seed)
    with UsageProducer(redis_url, batch_size=100, flush_interval_seconds=0.5) as producer:
        for n in range(count):
            subject = f"{prefix}-s{rng.randrange(subjects)}"
            cost = rng.randint(1, 3)
            event_id = producer.emit(
                subject, "calls", cost, event_id=f"{prefix}-{n:05d}", occurred_at=at
            )
            yield event_id, subject, cost


def assert_each_once_and_counters_exact(
    meter: Meter, emitted: Sequence[tuple[str, str, int]], workers: Sequence[Tailed]
) -> None:
    """Exactly one result per emitted id, all allowed, counters equal the sum of costs."""
    ids = [event_id for event_id, _, _ in emitted]
    assert len(set(ids)) == len(ids)
    missing = set(ids) - meter.decided(ids)
    assert not missing, f"{len(missing)} events without a result, e.g. {sorted(missing)[:5]}"
    assert meter.count_results() == len(ids), tails(workers)
    assert meter.outcome_counts() == {"allowed": len(ids)}
    expected = cost_by_subject(emitted)
    used = used_by_subject(meter, "calls")
    wrong = {s: (used.get(s), cost) for s, cost in expected.items() if used.get(s) != cost}
    assert not wrong, f"(counter, sum of costs) differ for {len(wrong)} subjects: {wrong}"
    assert set(used) == set(expected)
