"""The queued pipeline end to end with the worker in the test process.

Producer (`UsageProducer`, or raw messages) -> the session's Redis -> a
worker of our Celery app -> PostgreSQL, with exact results and counters.

Harness: ``celery.contrib.testing.worker.start_worker`` (what pytest-celery's
classic fixtures run; its Docker fixtures ``celery_worker`` and
``celery_setup`` are never requested) around ``workers.app.create_app(url,
settings)``, the app ``celery -A workers worker`` builds (only its idle wait
on Redis is shortened): the guarded Redis transport and consumer and the
worker bootsteps (the default queue, the webhook delivery thread) all run.
It is ready in about a tenth of a second, where a subprocess takes seconds,
so every pipeline test that needs no process runs here. What does
(SIGKILL, redelivery after the visibility timeout, a database outage,
counting pool processes, beat) stays with the subprocess harness
(`conftest.py`, `test_pipeline.py`). The worker is stopped warm, as SIGTERM
stops a real one (`start_worker` alone stops it cold, which skips the
bootsteps' ``stop`` and leaves the webhook thread running), and each test
fails if a thread outlives it.

The tasks find their settings and `Meter` through the module app of
`workers.tasks` (the one ``celery -A workers`` imports) and a module
global, so the fixture points both at the test's database while its
worker runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import random
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
import redis
from celery import Celery, bootsteps
from celery import _state as celery_app_state
from celery.contrib.testing.worker import start_worker
from celery.worker import WorkController
from celery.worker import state as worker_state
from pipeline_checks import (
    CALLS,
    RESULT_TIMEOUT,
    assert_each_once_and_counters_exact,
    cost_by_subject,
    decisions_of,
    queue_state,
    stream,
    used_by_subject,
    wait_for_results,
    wait_until,
)

import workers.tasks
from metering import Limit, Meter, make_event
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import UsageProducer, make_celery, queue_for
from metering.pipeline.routing import APPLY_BATCH_TASK as TASK_NAME
from metering.pipeline.routing import DEFAULT_QUEUE, SWEEP_RESERVATIONS_TASK, queue_names
from metering.settings import Settings
from workers.app import create_app
from workers.guard import GuardedConsumer, GuardedRedisTransport

STOP_TIMEOUT = 30.0
IDLE_WAIT_SECONDS = 0.1
LOG_TAIL_LINES = 60
_LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(threadName)s] %(name)s: %(message)s"


# -- the harness -------------------------------------------------------------------


class _Records(logging.Handler):
    """Keeps every record logged at INFO or above by threads other than the test's."""

    def __init__(self, test_thread: int) -> None:
        super().__init__(logging.INFO)
        self.test_thread = test_thread
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter(_LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.test_thread:
            self.records.append(record)


@dataclass
class InProcessWorker:
    """A ``WorkController`` of our app, running in a thread of the test process."""

    controller: WorkController
    records: _Records = field(repr=False)

    def alive(self) -> bool:
        """True while the worker runs: a fatal error stops its blueprint."""
        return bool(self.controller.blueprint.state == bootsteps.RUN)

    def log(self) -> str:
        return "\n".join(self.records.format(r) for r in list(self.records.records))

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = "\n".join(self.log().splitlines()[-lines:])
        return f"--- last {lines} lines of the in-process worker's log ---\n{text}"

    def batch_reports(self) -> list[dict[str, int]]:
        """What each run of the apply task reported (``workers.tasks`` logs it)."""
        # logging keeps a lone mapping argument as ``args`` itself.
        return [
            dict(record.args)  # type: ignore[arg-type]
            for record in list(self.records.records)
            if record.name == "workers.tasks" and record.msg == "batch applied: %s"
        ]

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Warm shutdown, as on SIGTERM: every bootstep's ``stop`` runs."""
        worker_state.should_stop = 0
        if not self.controller.blueprint.shutdown_complete.wait(timeout):
            raise AssertionError(f"the in-process worker did not stop in {timeout} s")


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """Undo what setting up a worker's logging does to the process's loggers."""
    kept = {
        name: (logger.level, list(logger.handlers), logger.propagate)
        for name in ("", "celery.task", "celery.redirected")
        for logger in [logging.getLogger(name)]
    }
    try:
        yield
    finally:
        for name, (level, handlers, propagate) in kept.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate


@contextlib.contextmanager
def _current_app_kept() -> Iterator[None]:
    """Creating and starting an app makes it Celery's current and default app."""
    default, current = celery_app_state.default_app, celery_app_state._tls.current_app
    try:
        yield
    finally:
        celery_app_state.set_default_app(default)
        celery_app_state._set_current_app(current)


def _threads_left(before: set[threading.Thread], timeout: float) -> list[str]:
    """Names of threads started since ``before`` still running after ``timeout``."""
    others = [t for t in threading.enumerate() if t not in before]
    for thread in others:
        thread.join(timeout / max(len(others), 1))
    return sorted(t.name for t in others if t.is_alive())


@contextlib.contextmanager
def run_inprocess_worker(
    app: Celery, *, consume: Sequence[str] | None, pool: str, concurrency: int
) -> Iterator[InProcessWorker]:
    """Run a worker of ``app``; stop it warm and check it left nothing behind."""
    records = _Records(threading.get_ident())
    root = logging.getLogger()
    with _logging_kept():
        root.addHandler(records)
        try:
            with start_worker(
                app,
                pool=pool,
                concurrency=concurrency,
                loglevel="INFO",
                # The ping check needs a result backend; the app has none.
                perform_ping_check=False,
                shutdown_timeout=STOP_TIMEOUT,
                queues=list(consume) if consume is not None else None,
            ) as controller:
                worker = InProcessWorker(controller, records)
                try:
                    yield worker
                finally:
                    worker.stop()
        finally:
            worker_state.should_stop = None
            root.removeHandler(records)


StartInProcessWorker = Callable[..., InProcessWorker]


@pytest.fixture
def inprocess_worker(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StartInProcessWorker]:
    """Start a ready in-process worker on this test's database and broker.

    ``inprocess_worker(queues=1, consume=("metering",), pool="solo",
    concurrency=1)``: ``queues`` is the settings' number of hash-routed
    queues, ``consume`` the worker's ``-Q`` (None: no ``-Q``, every queue
    the app declares). One at a time: Celery keeps a worker's shutdown flags
    per process. Stopped at the end of the test; the test fails if the
    worker, or anything the test started, left a thread running.
    """
    threads_before = set(threading.enumerate())
    monkeypatch.setattr(workers.tasks, "_meter", None)
    with contextlib.ExitStack() as stack:

        def start(
            *,
            queues: int = 1,
            consume: Sequence[str] | None = (DEFAULT_QUEUE,),
            pool: str = "solo",
            concurrency: int = 1,
        ) -> InProcessWorker:
            assert worker_state.should_stop is None, "one in-process worker at a time"
            settings = Settings(database_url=pg_url, broker_url=redis_url, queues=queues)
            monkeypatch.setattr(workers.tasks.app, "metering_settings", settings)
            # Undone in reverse: stop the worker, close its Meter and app, then
            # give Celery back its current app.
            stack.enter_context(_current_app_kept())
            app = create_app(redis_url, settings)
            # The one change to the app: an idle worker waits 0.1 s on Redis
            # (BLMOVE's timeout, kombu's polling_interval) rather than 1 s, the
            # time a warm stop waits for it to look at its shutdown flag.
            app.conf.broker_transport_options = {
                **app.conf.broker_transport_options,
                "polling_interval": IDLE_WAIT_SECONDS,
            }
            stack.callback(app.close)
            stack.callback(_close_task_meter)
            return stack.enter_context(
                run_inprocess_worker(app, consume=consume, pool=pool, concurrency=concurrency)
            )

        yield start
    left = _threads_left(threads_before, STOP_TIMEOUT)
    assert not left, f"threads still running after the in-process worker stopped: {left}"


def _close_task_meter() -> None:
    meter = workers.tasks._meter
    if meter is not None:
        meter.close()
        workers.tasks._meter = None


def applied_totals(worker: InProcessWorker) -> dict[str, int]:
    totals: Tally[str] = Tally()
    for report in worker.batch_reports():
        totals.update(report)
    return dict(totals)


# -- the harness itself ---------------------------------------------------------------


def test_the_inprocess_worker_is_our_app_and_leaves_no_thread_behind(
    pg_url: str, redis_url: str, inprocess_worker: StartInProcessWorker
) -> None:
    before = {t.name for t in threading.enumerate()}
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker()
        controller = worker.controller
        assert isinstance(controller.consumer, GuardedConsumer)
        with controller.app.connection() as connection:
            assert isinstance(connection.transport, GuardedRedisTransport)
        assert [q.name for q in controller.app.amqp.queues.consume_from.values()] == [DEFAULT_QUEUE]
        assert "metering-webhooks" in {t.name for t in threading.enumerate()} - before
        emitted = list(stream(redis_url, at, "h", 200, subjects=5, seed=1))
        wait_for_results(meter, len(emitted), [worker])
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        assert worker.alive()
        worker.stop()
        assert not worker.alive()
        assert "metering-webhooks" not in {t.name for t in threading.enumerate()}


# -- exactly once, duplicates, hard limits, stacked charges, bad input ----------------------


def test_each_event_id_is_applied_once_and_later_copies_change_nothing(
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker()
        emitted = list(stream(redis_url, at, "once", 3_000, subjects=30, seed=7))
        copies = emitted[::10]
        first_id, first_subject, first_cost = emitted[0]
        with UsageProducer(redis_url, batch_size=100) as producer:
            # The same events again under the same ids (a producer that retried) ...
            for event_id, subject, cost in copies:
                producer.emit(subject, "calls", cost, event_id=event_id, occurred_at=at)
            # ... and an id used again for other usage: a conflict, also not applied.
            producer.emit(first_subject, "calls", first_cost + 5, event_id=first_id, occurred_at=at)
        sent = len(emitted) + len(copies) + 1
        wait_until(
            lambda: sum(applied_totals(worker).values()) >= sent and queue_state(client) == (0, 0),
            RESULT_TIMEOUT,
            lambda: f"{applied_totals(worker)} of {sent} events, queue {queue_state(client)}",
            [worker],
        )
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        assert applied_totals(worker) == {
            "applied": len(emitted),
            "duplicates": len(copies),
            "conflicts": 1,
            "rejected": 0,
            "malformed": 0,
        }
        assert worker.alive(), worker.tail()


def _emit_in_order(
    redis_url: str, events: Iterable[tuple[str, list[tuple[str, str, int]]]]
) -> None:
    """One producer, flushed by size only: the queue holds the events in this order."""
    at = datetime.now(UTC)
    with UsageProducer(redis_url, batch_size=50, flush_interval_seconds=3600) as producer:
        for event_id, charges in events:
            producer.emit(charges=charges, event_id=event_id, occurred_at=at)


def test_a_hard_limit_is_never_exceeded_across_a_stream(
    pg_url: str, redis_url: str, inprocess_worker: StartInProcessWorker
) -> None:
    """One queue, one consumer: events are decided in the order they were
    emitted, so each decision and counter is known exactly beforehand."""
    maximum = 500
    tight = Limit("tight", maximum=maximum, period="1d", window="calendar")
    rng = random.Random(11)
    events = [(f"t-{n:04d}", f"acct-{rng.randrange(3)}", rng.randint(1, 9)) for n in range(1_200)]
    used: Tally[str] = Tally()
    denied: Tally[str] = Tally()
    denied_cost: Tally[str] = Tally()
    allowed_ids = set()
    for event_id, subject, cost in events:
        if used[subject] + cost <= maximum:
            used[subject] += cost
            allowed_ids.add(event_id)
        else:
            denied[subject] += 1
            denied_cost[subject] += cost
    assert all(denied.values()) and len(denied) == 3  # the limit really binds, for everyone

    with Meter(pg_url) as meter:
        meter.set_limits([tight])
        worker = inprocess_worker()
        _emit_in_order(redis_url, ((i, [(s, "tight", c)]) for i, s, c in events))
        wait_for_results(meter, len(events), [worker])

        assert meter.count_results() == len(events)
        assert meter.outcome_counts() == {
            "allowed": len(allowed_ids),
            "denied": len(events) - len(allowed_ids),
        }
        decisions = decisions_of(meter, [i for i, _, _ in events])
        assert {i for i, d in decisions.items() if d.allowed} == allowed_ids
        counters = {c.subject: c for c in meter.counters(limit="tight")}
        assert {s: (c.used, c.denied_count, c.denied_cost) for s, c in counters.items()} == {
            s: (used[s], denied[s], denied_cost[s]) for s in used
        }
        assert all(c.used <= maximum for c in counters.values())
        assert worker.alive(), worker.tail()


def test_stacked_charges_are_applied_all_or_nothing(
    pg_url: str, redis_url: str, inprocess_worker: StartInProcessWorker
) -> None:
    """Each event charges its user's seat limit and the shared org limit, both
    hard: either both counters take the cost or neither does."""
    seat = Limit("seat", maximum=40, period="1d", window="calendar")
    org = Limit("org", maximum=200, period="1d", window="calendar")
    rng = random.Random(12)
    events = []
    for n in range(400):
        # One heavy user, who runs out of seat while the organisation has room.
        user = "user-0" if rng.random() < 0.4 else f"user-{rng.randrange(1, 8)}"
        cost = rng.randint(1, 5)
        events.append((f"st-{n:04d}", [(user, "seat", cost), ("org-1", "org", cost)]))

    seat_used: Tally[str] = Tally()
    org_used = 0
    expected_denied_by: dict[str, tuple[str, ...]] = {}
    seat_denied: Tally[str] = Tally()
    for event_id, [(user, _, cost), _org] in events:
        denied_by = tuple(
            name
            for name, fits in (
                ("seat", seat_used[user] + cost <= seat.maximum),
                ("org", org_used + cost <= org.maximum),
            )
            if not fits
        )
        expected_denied_by[event_id] = denied_by
        if denied_by:
            seat_denied[user] += "seat" in denied_by
        else:
            seat_used[user] += cost
            org_used += cost
    kinds = Tally(expected_denied_by.values())
    # Each limit denies alone somewhere, and both together: every case is tested.
    assert all(kinds[k] for k in [(), ("seat",), ("org",), ("seat", "org")]), kinds

    with Meter(pg_url) as meter:
        meter.set_limits([seat, org])
        worker = inprocess_worker()
        _emit_in_order(redis_url, events)
        wait_for_results(meter, len(events), [worker])

        decisions = decisions_of(meter, [event_id for event_id, _ in events])
        assert {i: d.denied_by for i, d in decisions.items()} == expected_denied_by
        [org_counter] = meter.counters("org-1", "org")
        assert org_counter.used == org_used <= org.maximum
        assert org_counter.denied_count == sum("org" in d for d in expected_denied_by.values())
        seats = {c.subject: c for c in meter.counters(limit="seat")}
        assert {s: (c.used, c.denied_count) for s, c in seats.items()} == {
            s: (seat_used[s], seat_denied[s]) for s in seats
        }
        assert sum(c.used for c in seats.values()) == org_used
        assert worker.alive(), worker.tail()


def test_a_malformed_message_is_dead_lettered_and_the_worker_goes_on(
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker()
        before = list(stream(redis_url, at, "before", 300, subjects=5, seed=21))
        app = make_celery(redis_url)
        try:
            app.send_task(TASK_NAME, args=[{"nope": 1}], queue=DEFAULT_QUEUE)
        finally:
            app.close()
        client.lpush(DEFAULT_QUEUE, b"this is not json")
        after = list(stream(redis_url, at, "after", 300, subjects=5, seed=22))
        emitted = before + after
        wait_until(
            lambda: meter.count_results() >= len(emitted) and len(meter.rejected_messages()) >= 2,
            RESULT_TIMEOUT,
            lambda: f"{meter.count_results()} results, rejected {meter.rejected_messages()}",
            [worker],
        )
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        dead = sorted(meter.rejected_messages(), key=lambda r: r.reason)
        assert [event_id for event_id, _, _ in dead] == [None, None], dead
        assert json.loads(dead[0].raw) == {"nope": 1}, dead
        assert "not a metering batch" in dead[0].reason
        assert dead[1].raw == "this is not json", dead
        assert "not JSON" in dead[1].reason
        assert worker.alive(), worker.tail()
        assert "Unrecoverable error" not in worker.log(), worker.tail()


# -- moved from test_pipeline.py: the same assertions, on the in-process worker ----------


def test_a_worker_consumes_every_hash_routed_queue_it_is_configured_for(
    pg_url: str, redis_url: str, inprocess_worker: StartInProcessWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker(queues=3, consume=None)
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
    pg_url: str, redis_url: str, inprocess_worker: StartInProcessWorker, dash_q: bool
) -> None:
    """Issue 12: ``metering worker --queues 2`` consumed metering.0 and metering.1
    but never ``metering``, where beat's sweeps and single-queue producers publish."""
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        held = meter.reserve("default-q", "calls", ttl_seconds=0.01)
        assert held.state == "held"
        # What ``-Q metering.0,metering.1`` hands the worker.
        consume = queue_names(2) if dash_q else None
        worker = inprocess_worker(queues=2, consume=consume)
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


def test_a_batch_delivered_three_times_changes_counters_once(
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
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
        worker = inprocess_worker()
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


def test_ids_and_metadata_the_database_cannot_store_lose_no_valid_event(
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
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
        worker = inprocess_worker()
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
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
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
        with meter.sql_engine.begin() as connection:
            connection.exec_driver_sql(
                f"ALTER TABLE results ADD CONSTRAINT no_r4 CHECK (event_id <> '{refused}')"
            )
        worker = inprocess_worker()
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
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
) -> None:
    at = datetime.now(UTC)
    valid = ["v-0", "v-1"]
    payload = encode_batch([encode_event(make_event([(i, "calls", 1)], at, i)) for i in valid])
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker()
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
    pg_url: str, redis_url: str, client: redis.Redis, inprocess_worker: StartInProcessWorker
) -> None:
    """Raw entries kombu cannot parse, and envelopes Celery would drop with a
    log line (undecodable body, unknown task, pickle), each land in the
    dead-letter record; the worker goes on and applies the valid batch."""
    at = datetime.now(UTC)
    valid = ["j-0", "j-1"]
    payload = encode_batch([encode_event(make_event([(i, "calls", 1)], at, i)) for i in valid])
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = inprocess_worker()
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
