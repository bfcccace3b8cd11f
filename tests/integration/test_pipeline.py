"""The queued pipeline end to end: producers, Redis, real Celery workers, PostgreSQL.

SPEC invariants 1 (exactly once), 2 (no lost updates) and 5 (nothing is
lost): every event a producer accepted gets exactly one result, and counters
equal applying each event once, however messages are delivered, redelivered
after a worker is killed, retried through a database outage, or mixed with
malformed input.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import subprocess
import sys
import time
from collections import Counter as Tally
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis
from pipeline_checks import (
    CALLS,
    assert_each_once_and_counters_exact,
    cost_by_subject,
    decisions_of,
    queue_state,
    stream,
    tails,
    used_by_subject,
    wait_for_results,
    wait_until,
)
from servers import PostgresServer

from metering import ChargeDecision, Limit, Meter, make_event
from metering.errors import UnknownLimit
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import UsageProducer, make_celery
from metering.pipeline.routing import APPLY_BATCH_TASK as TASK_NAME
from metering.pipeline.routing import DEFAULT_QUEUE
from metering.upkeep.audit import run_audit

# METERING_VISIBILITY_TIMEOUT of the workers that conftest.py's `start_worker` starts.
VISIBILITY_TIMEOUT = 5

pytestmark = pytest.mark.slow

ORG_MAXIMUM = 300
ORG = Limit("org", maximum=ORG_MAXIMUM, period="1d", window="calendar")


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


# -- 2. a worker killed mid-stream -----------------------------------------------------

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
        emitted: list[tuple[str, str, int]] = []
        killed: tuple[int, tuple[int, int]] | None = None
        for row in stream(redis_url, at, "kill", KILL_STREAM, subjects=50, seed=3):
            emitted.append(row)
            if killed is None and len(emitted) == KILL_STREAM // 2:
                # Half the stream is queued before the worker starts (a worker
                # running beside the producer may keep up with it and be idle
                # when killed): kill it while it works through that half, and
                # queue the other half while no worker runs.
                first = start_worker()
                killed = kill_when_busy(meter, first, client, 300)
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
        assert run_audit(meter, full=True).violations == ()
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
    visibility = 20  # long enough for a second worker to start on a loaded machine
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        # Queued before the worker starts, so it is busy when killed (see above).
        emitted = list(stream(redis_url, at, "lost", 3_000, subjects=20, seed=4))
        first = start_worker(METERING_VISIBILITY_TIMEOUT=str(visibility))
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


# -- 3. PostgreSQL stopped for ten seconds -----------------------------------------------

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


# -- 4. malformed messages -------------------------------------------------------------------


def test_a_malformed_message_is_recorded_and_the_worker_keeps_going(
    pg_url: str, redis_url: str, client: redis.Redis, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)

    def batch(*ids: str) -> list[dict[str, Any]]:
        return [encode_event(make_event([(f"m-{i}", "calls", 2)], at, i)) for i in ids]

    first = batch("a-0", "a-1", "a-2")
    mixed = batch("c-0", "c-bad", "c-2")
    mixed[1]["charges"][0][2] = -1  # a negative cost: the event keeps a usable id
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


def test_an_event_for_an_unknown_limit_is_listed_then_replayed_once(
    pg_url: str,
    redis_url: str,
    client: redis.Redis,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker-only producer queues a typo; a real worker rejects it, and it
    is listed; once the limit exists, replay applies it, and the queue
    delivering it again changes nothing."""
    monkeypatch.delenv("METERING_DATABASE_URL", raising=False)
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker()
        with UsageProducer(redis_url) as producer:  # a broker only: it cannot check
            producer.emit("org-42", "api_cals", cost=3, event_id="typo-1", occurred_at=at)
        wait_until(lambda: meter.decided(["typo-1"]) == {"typo-1"}, 60, worker.tail, [worker])
        [(event_id, reason, _)] = meter.rejected_messages()
        assert (event_id, reason) == ("typo-1", str(UnknownLimit("api_cals")))

        meter.set_limit(Limit("api_cals", maximum=100, period="1d"))
        [decided] = meter.replay_rejected().applied
        assert (decided.event_id, decided.outcome) == ("typo-1", "allowed")
        with UsageProducer(redis_url) as producer:  # delivered again
            producer.emit("org-42", "api_cals", cost=3, event_id="typo-1", occurred_at=at)
        wait_until(
            lambda: queue_state(client) == (0, 0) and worker.log().count("succeeded in") >= 2,
            60,
            worker.tail,
            [worker],
        )
        assert meter.replay_rejected().applied == ()
        assert meter.result("typo-1").outcome == "allowed"  # type: ignore[union-attr]
        assert used_by_subject(meter, "api_cals") == {"org-42": 3}
        assert meter.rejected_messages() == []
