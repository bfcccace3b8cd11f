"""The queued pipeline end to end: producers, Redis, real Celery workers, PostgreSQL.

SPEC invariants 1 (exactly once), 2 (no lost updates) and 5 (nothing is
lost): every event a producer accepted gets exactly one result, and counters
equal applying each event once, however messages are delivered, redelivered
after a worker is killed, retried through a database outage, or mixed with
malformed input.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import random
import subprocess
import sys
import time
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis
from servers import PostgresServer

from metering import ChargeDecision, Decision, Limit, Meter, make_event
from metering.ledger import decision_of
from metering.pipeline import encode_batch, encode_event
from metering.producer import UsageProducer, make_celery, queue_for
from metering.routing import APPLY_BATCH_TASK as TASK_NAME
from metering.routing import DEFAULT_QUEUE, SWEEP_RESERVATIONS_TASK, queue_names
from metering.storage.engine import run_transaction
from metering.storage.queries import Store

# METERING_VISIBILITY_TIMEOUT of the workers that conftest.py's `start_worker` starts.
VISIBILITY_TIMEOUT = 5

pytestmark = pytest.mark.slow

HUGE = 10**12
CALLS = Limit("calls", maximum=HUGE, period="1d", window="calendar")
ORG_MAXIMUM = 300
ORG = Limit("org", maximum=ORG_MAXIMUM, period="1d", window="calendar")

RESULT_TIMEOUT = 120.0
POLL = 0.2


# -- helpers ---------------------------------------------------------------------


class Worker(Protocol):
    """What the tests use of conftest's `Worker` (a ``celery -A workers worker``)."""

    name: str
    env: dict[str, str]

    def alive(self) -> bool: ...
    def wait_ready(self, timeout: float = ...) -> None: ...
    def members(self) -> list[int]: ...
    def log(self) -> str: ...
    def tail(self, lines: int = ...) -> str: ...
    def kill(self) -> None: ...
    def stop(self, timeout: float = ...) -> None: ...


class StartWorker(Protocol):
    def __call__(self, *, wait: bool = ..., **overrides: str) -> Worker: ...


def tails(workers: Iterable[Worker]) -> str:
    return "\n".join(worker.tail() for worker in workers)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: Callable[[], str],
    workers: Sequence[Worker] = (),
    poll: float = POLL,
) -> None:
    """Poll ``condition`` until true; fail with ``what()`` and the worker logs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s: {what()}\n{tails(workers)}")
        time.sleep(poll)


def wait_for_results(
    meter: Meter, expected: int, workers: Sequence[Worker], timeout: float = RESULT_TIMEOUT
) -> None:
    wait_until(
        lambda: meter.count_results() >= expected,
        timeout,
        lambda: f"{meter.count_results()} of {expected} results",
        workers,
    )


def decisions_of(meter: Meter, event_ids: Iterable[str]) -> dict[str, Decision]:
    records = run_transaction(meter.engine, lambda c: Store(c).fetch_results(event_ids))
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


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A Redis client on the broker, to look at the queue."""
    connection = redis.Redis.from_url(redis_url)
    try:
        yield connection
    finally:
        connection.close()


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
    meter: Meter, emitted: Sequence[tuple[str, str, int]], workers: Sequence[Worker]
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


def test_a_worker_consumes_every_hash_routed_queue_it_is_configured_for(
    pg_url: str, redis_url: str, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker(only_default_queue=False, METERING_QUEUES="3")
        emitted = []
        with UsageProducer(redis_url, batch_size=50, queues=3) as producer:
            for n in range(600):
                subject = f"routed-{n % 40}"
                event_id = producer.emit(subject, "calls", 1, event_id=f"r-{n}", occurred_at=at)
                emitted.append((event_id, subject, 1))
        assert {queue_for(s, 3) for _, s, _ in emitted} == {
            "metering.0",
            "metering.1",
            "metering.2",
        }
        wait_for_results(meter, len(emitted), [worker])
        assert_each_once_and_counters_exact(meter, emitted, [worker])


@pytest.mark.parametrize("dash_q", [True, False], ids=["-Q metering.0,metering.1", "no -Q"])
def test_a_worker_of_hash_routed_queues_also_consumes_the_default_queue(
    pg_url: str, redis_url: str, start_worker: StartWorker, dash_q: bool
) -> None:
    """Issue 12: ``metering worker --queues 2`` consumed metering.0 and metering.1
    but never ``metering``, where beat's sweeps and single-queue producers publish."""
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        held = meter.reserve("default-q", "calls", ttl_seconds=0.01)
        assert held.state == "held"
        queues = ",".join(queue_names(2)) if dash_q else None
        worker = start_worker(only_default_queue=False, queues=queues, METERING_QUEUES="2")
        app = make_celery(redis_url)
        try:
            # A batch, as a single-queue producer (or `metering emit`) sends it.
            events = [make_event([("default-q", "calls", 1)], at, f"dq-{n}") for n in range(3)]
            batch = encode_batch([encode_event(e) for e in events])
            app.send_task(TASK_NAME, args=[batch], queue=DEFAULT_QUEUE)
            # And a sweep, as beat sends it.
            app.send_task(SWEEP_RESERVATIONS_TASK, queue=DEFAULT_QUEUE)
        finally:
            app.close()
        wait_for_results(meter, 4, [worker])  # the reservation's result and the batch's 3
        assert meter.decided([e.event_id for e in events]) == {e.event_id for e in events}
        wait_until(
            lambda: meter.reservation(held.id).state == "committed",  # type: ignore[union-attr]
            RESULT_TIMEOUT,
            lambda: f"the reservation is {meter.reservation(held.id)}",
            [worker],
        )


# -- 1. four producers, two workers ------------------------------------------------

PRODUCERS = 4
EVENTS_PER_PRODUCER = 5_000
SUBJECTS = [f"user-{n:03d}" for n in range(500)]
# The first 50 users also charge their organisation's hard limit (10 users each).
ORG_OF = {subject: f"org-{n % 5}" for n, subject in enumerate(SUBJECTS[:50])}


def _produce(redis_url: str, producer: int, at_iso: str, out: str) -> None:
    rng = random.Random(producer)
    at = datetime.fromisoformat(at_iso)
    emitted = []
    with UsageProducer(redis_url, batch_size=250) as usage:
        for n in range(EVENTS_PER_PRODUCER):
            subject = SUBJECTS[rng.randrange(len(SUBJECTS))]
            cost = rng.randint(1, 3)
            charges = [(subject, "calls", cost)]
            if subject in ORG_OF:
                charges.append((ORG_OF[subject], "org", cost))
            event_id = usage.emit(charges=charges, event_id=f"p{producer}-{n:05d}", occurred_at=at)
            emitted.append([event_id, subject, cost])
    Path(out).write_text(json.dumps(emitted))


def _serial_chain(
    consumed: list[ChargeDecision], seen: list[ChargeDecision], maximum: int | None
) -> str | None:
    """Why these charges of one counter are not some one-by-one order, or None.

    ``consumed`` are the charges of allowed events: ordered by the ``used``
    they left, each must add exactly its cost. ``seen`` are charges of denied
    events: each must have seen one of those states (``used`` is then the
    figure before the event) and, against a hard ``maximum``, not have fit.
    """
    states = [0]
    for charge in sorted(consumed, key=lambda c: c.used):
        if charge.used != states[-1] + charge.cost:
            return f"used {charge.used} after {states[-1]} + cost {charge.cost}"
        states.append(charge.used)
    reachable = set(states)
    for charge in seen:
        if charge.used not in reachable:
            return f"a denied event saw used={charge.used}, never a state of the counter"
        if maximum is not None and charge.used + charge.cost <= maximum:
            return f"denied although {charge.used} + {charge.cost} <= {maximum}"
    return None


def test_every_event_gets_exactly_one_result_from_four_producers(
    pg_url: str, redis_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS, ORG])
        workers = [start_worker(wait=False), start_worker(wait=False)]
        for worker in workers:
            worker.wait_ready()

        context = multiprocessing.get_context("fork")
        outputs = [tmp_path / f"producer-{p}.json" for p in range(PRODUCERS)]
        procs = [
            context.Process(target=_produce, args=(redis_url, p, at.isoformat(), str(out)))
            for p, out in enumerate(outputs)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
        assert [proc.exitcode for proc in procs] == [0] * PRODUCERS
        emitted = [tuple(row) for out in outputs for row in json.loads(out.read_text())]
        total = PRODUCERS * EVENTS_PER_PRODUCER
        assert len(emitted) == total

        wait_for_results(meter, total, workers)
        ids = [event_id for event_id, _, _ in emitted]
        assert meter.count_results() == total, tails(workers)
        assert meter.decided(ids) == set(ids)
        decisions = decisions_of(meter, ids)
        assert set(decisions) == set(ids)

        # Per counter: what each allowed event consumed, and what denied events saw.
        consumed: dict[tuple[str, str], list[ChargeDecision]] = defaultdict(list)
        seen: dict[tuple[str, str], list[ChargeDecision]] = defaultdict(list)
        allowed: list[tuple[str, str, int]] = []
        denied_per_org: Tally[str] = Tally()
        for event_id, subject, cost in emitted:
            decision = decisions[event_id]
            stacked = subject in ORG_OF
            assert [(c.subject, c.limit, c.cost) for c in decision.charges] == (
                [(subject, "calls", cost)] + ([(ORG_OF[subject], "org", cost)] if stacked else [])
            )
            if decision.outcome == "allowed":
                allowed.append((event_id, subject, cost))
            else:
                # Only a hard org limit can deny here, and only a stacked event.
                assert (decision.outcome, decision.denied_by, stacked) == (
                    "denied",
                    ("org",),
                    True,
                ), decision
                denied_per_org[ORG_OF[subject]] += 1
            for charge in decision.charges:
                key = (charge.subject, charge.limit)
                (consumed if decision.allowed else seen)[key].append(charge)
        # The org limits were really contended: every organisation denied something.
        assert set(denied_per_org) == set(ORG_OF.values()), denied_per_org

        # The sequential model: each counter is one-by-one application of its events.
        for (subject, limit), charges in consumed.items():
            maximum = ORG_MAXIMUM if limit == "org" else None
            problem = _serial_chain(charges, seen.get((subject, limit), []), maximum)
            assert problem is None, f"{subject}/{limit}: {problem}"

        calls_used = used_by_subject(meter, "calls")
        expected_calls = cost_by_subject(allowed)
        assert calls_used == {s: expected_calls.get(s, 0) for s in calls_used}
        assert set(expected_calls) <= set(calls_used)
        assert all(c.denied_count == 0 for c in meter.counters(limit="calls"))

        org_allowed: dict[str, int] = defaultdict(int)
        for _, subject, cost in allowed:
            if subject in ORG_OF:
                org_allowed[ORG_OF[subject]] += cost
        org_counters = {c.subject: c for c in meter.counters(limit="org")}
        assert set(org_counters) == set(ORG_OF.values())
        for org, counter in org_counters.items():
            assert counter.used <= ORG_MAXIMUM, counter
            assert counter.used == org_allowed[org], counter
            assert counter.denied_count == denied_per_org[org], counter
        for worker in workers:
            assert worker.alive(), worker.tail()


# -- 2. one message delivered three times -------------------------------------------


def test_a_batch_delivered_three_times_changes_counters_once(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    small = Limit("small", maximum=10, period="1d", window="calendar")
    events = [
        make_event([(f"s{n % 5}", "calls", 1 + n % 3)], at, f"dup-{n:03d}") for n in range(40)
    ]
    # Eight events of cost 2 against a hard maximum of 10: five fit, three are denied.
    events += [make_event([("tight", "small", 2)], at, f"tight-{n}") for n in range(8)]
    payload = encode_batch([encode_event(e) for e in events])

    with Meter(pg_url) as meter:
        meter.set_limits([CALLS, small])
        worker = start_worker()
        app = make_celery(redis_url)
        try:
            for _ in range(3):
                app.send_task(TASK_NAME, args=[payload], queue=DEFAULT_QUEUE)
        finally:
            app.close()

        def consumed() -> bool:
            return worker.log().count("succeeded in") >= 3 and queue_state(client) == (0, 0)

        wait_until(
            consumed,
            60,
            lambda: (
                f"queue (waiting, unacked) = {queue_state(client)}, "
                f"{worker.log().count('succeeded in')} tasks succeeded"
            ),
            [worker],
        )

        assert meter.count_results() == len(events), worker.tail()
        assert meter.outcome_counts() == {"allowed": 45, "denied": 3}
        expected = cost_by_subject(
            (e.event_id, e.charges[0].subject, e.charges[0].cost) for e in events[:40]
        )
        assert used_by_subject(meter, "calls") == expected
        [tight] = meter.counters("tight", "small")
        assert (tight.used, tight.denied_count, tight.denied_cost) == (10, 3, 6)
        # All three deliveries reached `apply_batch`: the first applied, the others were duplicates.
        log = worker.log()
        assert log.count("batch applied: {'applied': 48, 'duplicates': 0,") == 1, worker.tail()
        assert log.count("batch applied: {'applied': 0, 'duplicates': 48,") == 2, worker.tail()


# -- 3. a worker killed mid-stream -----------------------------------------------------

KILL_STREAM = 6_000


def held_since(client: redis.Redis) -> float | None:
    """When (epoch seconds) the newest message still held by some worker was taken."""
    newest = client.zrange("unacked_index", -1, -1, withscores=True)
    return float(newest[0][1]) if newest else None


def kill_when_busy(
    meter: Meter, worker: Worker, client: redis.Redis, results: int
) -> tuple[int, tuple[int, int]]:
    """SIGKILL ``worker`` once ``results`` results exist; (results then, queue state then)."""
    wait_until(
        lambda: meter.count_results() >= results,
        60,
        lambda: f"{meter.count_results()} of {results} results",
        [worker],
        poll=0.02,
    )
    worker.kill()
    return meter.count_results(), queue_state(client)


def test_a_worker_killed_with_sigkill_loses_and_doubles_nothing(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        first = start_worker()
        emitted: list[tuple[str, str, int]] = []
        killed: tuple[int, tuple[int, int]] | None = None
        for row in stream(redis_url, at, "kill", KILL_STREAM, subjects=50, seed=3):
            emitted.append(row)
            if killed is None and len(emitted) == KILL_STREAM // 2:
                # Half the stream is queued: kill the worker while it works through it,
                # and queue the other half while no worker runs.
                killed = kill_when_busy(meter, first, client, 500)
        assert killed is not None
        at_kill, (_, unacked) = killed
        assert 0 < at_kill < KILL_STREAM // 2, killed
        # The worker died holding messages it had taken and not acknowledged.
        assert unacked > 0, (killed, first.tail())

        # Start the replacement once the held messages are past the
        # visibility timeout, so its start-up scan redelivers them (the test
        # below covers a worker that is already running).
        taken = held_since(client)
        assert taken is not None
        wait_until(
            lambda: time.time() > taken + VISIBILITY_TIMEOUT + 1,
            VISIBILITY_TIMEOUT + 5,
            lambda: "the clock did not move",
        )
        second = start_worker()
        wait_for_results(meter, KILL_STREAM, [first, second])
        wait_until(
            lambda: queue_state(client) == (0, 0),
            30,
            lambda: f"queue (waiting, unacked) = {queue_state(client)}",
            [second],
        )
        assert_each_once_and_counters_exact(meter, emitted, [first, second])
        assert second.alive(), second.tail()


def restore_lock_seconds(worker: Worker) -> int:
    """How long a worker with this environment holds kombu's restore lock at most."""
    script = (
        "from workers.app import create_app; "
        "print(create_app().conf.broker_transport_options.get('unacked_mutex_expire', 300))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=worker.env, capture_output=True, text=True, check=True
    )
    return int(float(out.stdout))


def test_a_dead_workers_message_is_redelivered_soon_after_the_visibility_timeout(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    visibility = 10
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        first = start_worker(METERING_VISIBILITY_TIMEOUT=str(visibility))
        emitted = list(stream(redis_url, at, "lost", 3_000, subjects=20, seed=4))
        at_kill, (_, unacked) = kill_when_busy(meter, first, client, 300)
        killed_at = time.monotonic()
        assert 0 < at_kill < len(emitted) and unacked > 0, (at_kill, unacked, first.tail())
        # The worst moment to die: while holding kombu's restore lock (a
        # redis-py lock), which every worker needs before it may bring held
        # messages back. It lives as long as the dead worker asked for.
        client.set("unacked_mutex", "token-of-the-killed-worker", ex=restore_lock_seconds(first))
        # A worker that is running when the held messages pass the timeout:
        # it starts well within the timeout, so its start-up scan is too early.
        second = start_worker(METERING_VISIBILITY_TIMEOUT=str(visibility))
        assert time.monotonic() - killed_at < visibility - 2, "the second worker started late"
        # Restore runs every visibility/2; the rest must then be applied on a busy machine.
        margin = 45
        wait_for_results(meter, len(emitted), [first, second], timeout=visibility + margin)
        assert_each_once_and_counters_exact(meter, emitted, [first, second])


# -- 4. PostgreSQL stopped for ten seconds -----------------------------------------------

OUTAGE_STREAM = 4_000


def test_worker_recovers_after_postgresql_is_stopped_for_ten_seconds(
    pg_url: str,
    redis_url: str,
    client: redis.Redis,
    postgres_server: PostgresServer,
    start_worker: StartWorker,
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        emitted: list[tuple[str, str, int]] = []
        at_stop: int | None = None
        try:
            for row in stream(redis_url, at, "outage", OUTAGE_STREAM, subjects=40, seed=5):
                emitted.append(row)
                if at_stop is None and len(emitted) == OUTAGE_STREAM // 2:
                    # Stop the database while the worker is applying the first half;
                    # the second half is queued into Redis during the outage.
                    wait_for_results(meter, 300, [worker], timeout=60)
                    postgres_server.stop()
                    at_stop = len(emitted)
            time.sleep(10)  # The outage itself: this sleep is the point of the test.
            assert worker.alive(), worker.tail()
        finally:
            postgres_server.start()
        assert at_stop is not None
        wait_for_results(meter, OUTAGE_STREAM, [worker])
        wait_until(
            lambda: queue_state(client) == (0, 0),
            30,
            lambda: f"queue (waiting, unacked) = {queue_state(client)}",
            [worker],
        )
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        # The outage was real: batches failed on the database and were retried.
        assert "DatabaseUnavailable" in worker.log(), worker.tail()
        assert worker.alive(), worker.tail()


# -- 5. malformed messages -------------------------------------------------------------------


def test_a_malformed_message_is_recorded_and_the_worker_keeps_going(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)

    def batch(*ids: str) -> list[dict[str, Any]]:
        return [encode_event(make_event([(f"m-{i}", "calls", 2)], at, i)) for i in ids]

    first = batch("a-0", "a-1", "a-2")
    mixed = batch("c-0", "c-bad", "c-2")
    mixed[1]["charges"][0][2] = 0  # a cost of 0: the event keeps a usable id
    last = batch("d-0", "d-1", "d-2")
    garbage = {"nope": 1}
    valid = ["a-0", "a-1", "a-2", "c-0", "c-2", "d-0", "d-1", "d-2"]

    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        processes = sorted(worker.members())
        app = make_celery(redis_url)
        try:
            for payload in (encode_batch(first), garbage, encode_batch(mixed), encode_batch(last)):
                app.send_task(TASK_NAME, args=[payload], queue=DEFAULT_QUEUE)
        finally:
            app.close()

        wait_until(
            lambda: meter.decided(valid) == set(valid) and len(meter.rejected_messages()) >= 2,
            60,
            lambda: f"decided {sorted(meter.decided(valid))}, rejected {meter.rejected_messages()}",
            [worker],
        )
        wait_until(
            lambda: worker.log().count("succeeded in") >= 4 and queue_state(client) == (0, 0),
            30,
            lambda: f"queue (waiting, unacked) = {queue_state(client)}",
            [worker],
        )

        assert meter.count_results() == len(valid)
        assert meter.outcome_counts() == {"allowed": len(valid)}
        assert used_by_subject(meter, "calls") == {f"m-{i}": 2 for i in valid}
        rejected = meter.rejected_messages()
        assert len(rejected) == 2, rejected
        by_id = {event_id: (reason, raw) for event_id, reason, raw in rejected}
        reason, raw = by_id["c-bad"]
        assert "cost" in reason, rejected
        assert json.loads(raw)["id"] == "c-bad"
        reason, raw = by_id[None]
        assert json.loads(raw) == garbage, rejected
        assert "not a metering batch" in reason, rejected

        # The worker is still running, with the same processes: none of them died.
        assert worker.alive(), worker.tail()
        assert sorted(worker.members()) == processes, worker.tail()
        assert "succeeded in" in worker.log(), worker.tail()


def test_ids_and_metadata_the_database_cannot_store_lose_no_valid_event(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    """A lone surrogate or a NUL in an id, or a lone surrogate in metadata:
    the batch's valid events are applied, the poison is kept with its error."""
    at = datetime.now(UTC)
    events = [encode_event(make_event([(f"p-{i}", "calls", 1)], at, f"p-{i}")) for i in range(4)]
    events[1]["id"] = "bad-\ud800"
    events[2]["id"] = "bad-\x00"
    events[3]["meta"] = {"note": "\udc80"}
    events.append(encode_event(make_event([("p-4", "calls", 1)], at, "p-4")))
    valid = ["p-0", "p-4"]

    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        app = make_celery(redis_url)
        try:
            app.send_task(TASK_NAME, args=[encode_batch(events)], queue=DEFAULT_QUEUE)
        finally:
            app.close()
        wait_until(
            lambda: meter.decided(valid) == set(valid) and len(meter.rejected_messages()) >= 3,
            60,
            lambda: f"decided {sorted(meter.decided(valid))}, rejected {meter.rejected_messages()}",
            [worker],
        )
        wait_until(lambda: queue_state(client) == (0, 0), 30, lambda: "queue not drained", [worker])

        assert meter.count_results() == 2
        rejected = meter.rejected_messages()
        assert len(rejected) == 3, rejected
        by_raw = {
            json.loads(raw).get("meta") is not None: (event_id, reason)
            for event_id, reason, raw in rejected
        }
        assert by_raw[True] == ("p-3", by_raw[True][1])
        assert "metadata" in by_raw[True][1]
        assert sorted(event_id or "" for event_id, _, _ in rejected) == ["", "", "p-3"]
        assert worker.alive(), worker.tail()


def test_an_event_the_database_refuses_is_dead_lettered_and_not_retried(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    """A statement PostgreSQL refuses for one event (here a CHECK constraint an
    operator added) cannot succeed on retry: the batch's other events are
    applied, the refused one is kept in the dead-letter record, the message is
    finished."""
    at = datetime.now(UTC)
    ids = [f"r-{i}" for i in range(9)]
    refused = "r-4"
    events = [encode_event(make_event([(i, "calls", 1)], at, i)) for i in ids]
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        with meter.engine.begin() as connection:
            connection.exec_driver_sql(
                f"ALTER TABLE results ADD CONSTRAINT no_r4 CHECK (event_id <> '{refused}')"
            )
        worker = start_worker()
        app = make_celery(redis_url)
        try:
            app.send_task(TASK_NAME, args=[encode_batch(events)], queue=DEFAULT_QUEUE)
        finally:
            app.close()
        valid = set(ids) - {refused}
        wait_until(
            lambda: meter.decided(ids) == valid and queue_state(client) == (0, 0),
            30,
            lambda: f"decided {sorted(meter.decided(ids))}, queue {queue_state(client)}",
            [worker],
        )
        [(event_id, reason, raw)] = meter.rejected_messages()
        assert event_id == refused and "no_r4" in reason, reason
        assert json.loads(raw)["id"] == refused
        assert used_by_subject(meter, "calls") == dict.fromkeys(sorted(valid), 1)
        assert worker.alive() and "Retry in" not in worker.log(), worker.tail()


def test_a_message_with_the_wrong_task_arguments_is_kept_with_its_error(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    valid = ["v-0", "v-1"]
    payload = encode_batch([encode_event(make_event([(i, "calls", 1)], at, i)) for i in valid])
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        app = make_celery(redis_url)
        try:
            app.send_task(TASK_NAME, args=[], queue=DEFAULT_QUEUE)
            app.send_task(TASK_NAME, args=["one", "two"], queue=DEFAULT_QUEUE)
            app.send_task(TASK_NAME, args=[payload], queue=DEFAULT_QUEUE)
        finally:
            app.close()
        # Every message is consumed (acks_late: acknowledged once its task is over).
        wait_until(
            lambda: meter.decided(valid) == set(valid) and queue_state(client) == (0, 0),
            30,
            lambda: f"queue (waiting, unacked) = {queue_state(client)}",
            [worker],
        )
        assert worker.alive(), worker.tail()
        rejected = meter.rejected_messages()
        assert len(rejected) == 2, f"{rejected}\n{worker.tail()}"


def envelope(body: bytes, *, task: str = TASK_NAME, tag: str = "t-1") -> bytes:
    """A kombu envelope as the Redis transport stores it, around ``body``."""
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"task": task, "id": f"id-{tag}", "lang": "py", "argsrepr": ""},
            "properties": {
                "delivery_tag": tag,
                "body_encoding": "base64",
                "delivery_mode": 2,
                "priority": 0,
                "delivery_info": {"exchange": "", "routing_key": DEFAULT_QUEUE},
            },
        }
    ).encode()


POISON_ENTRIES = {
    "not json": b"this is not json",
    "an array": b"[]",
    "a bare string": b'"a bare string"',
    "not utf-8": b"\xff\xfe{",
    "no properties": b'{"body": "e30="}',
    "body not base64": envelope(b"").replace(b'"body": ""', b'"body": "%%%"'),
    "body not json": envelope(b"{not json", tag="t-2"),
}


def test_queue_entries_that_are_not_tasks_are_dead_lettered_and_stop_no_worker(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    """Raw entries kombu cannot parse, and envelopes Celery would drop with a
    log line (undecodable body, unknown task, pickle), each land in the
    dead-letter record; the worker goes on and applies the valid batch."""
    at = datetime.now(UTC)
    valid = ["j-0", "j-1"]
    payload = encode_batch([encode_event(make_event([(i, "calls", 1)], at, i)) for i in valid])
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        for entry in POISON_ENTRIES.values():
            client.lpush(DEFAULT_QUEUE, entry)
        app = make_celery(redis_url)
        try:
            app.send_task("metering.no_such_task", args=[payload], queue=DEFAULT_QUEUE)
            app.send_task(TASK_NAME, args=[payload], queue=DEFAULT_QUEUE, serializer="pickle")
            app.send_task(TASK_NAME, args=[payload], queue=DEFAULT_QUEUE)
        finally:
            app.close()
        expected = len(POISON_ENTRIES) + 2
        wait_until(
            lambda: (
                meter.decided(valid) == set(valid)
                and len(meter.rejected_messages()) >= expected
                and queue_state(client) == (0, 0)
            ),
            30,
            lambda: f"decided {sorted(meter.decided(valid))}, {meter.rejected_messages()}",
            [worker],
        )
        assert worker.alive(), worker.tail()
        dead = meter.rejected_messages()
        assert len(dead) == expected, dead
        reasons = " | ".join(reason for _, reason, _ in dead)
        raws = " | ".join(raw for _, _, raw in dead)
        assert "this is not json" in raws and "\\xff\\xfe{" in raws
        assert "a bare string" in raws and "{not json" in raws
        assert "no such task" in reasons and "metering.no_such_task" in raws
        assert "application/x-python-serialize" in raws
        assert all(event_id is None for event_id, _, _ in dead)
        assert [c.used for c in meter.counters(limit="calls")] == [1, 1]
