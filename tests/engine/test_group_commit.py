"""Group commit: concurrent `consume` calls share transactions, each caller
still gets its own exact answer (SQLite and PostgreSQL).

To put chosen calls into one shared batch, a test holds the database's write
lock from another connection: the first call (the leader) waits on it, the
others queue behind it, and when the lock is released the queue is applied
as one batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, func, select, text

from metering import Decision, FrozenClock, Limit, Meter
from metering.domain.events import EventRecord
from metering.engine.fast import Answer
from metering.errors import EventConflict, InvalidInput, StorageError, UnknownLimit
from metering.storage.tables import counters, results

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        yield m


def batch_sizes(meter: Meter) -> list[int]:
    """Record the size of every batch the meter's group applies."""
    sizes: list[int] = []
    apply = meter._engine._group._apply

    def recording(records: Sequence[EventRecord]) -> list[Answer]:
        sizes.append(len(records))
        return apply(records)

    meter._engine._group._apply = recording
    return sizes


def totals(meter: Meter) -> tuple[dict[str, int], tuple[int, int]]:
    with meter.sql_engine.connect() as connection:
        outcomes = dict(
            connection.execute(
                select(results.c.outcome, func.count()).group_by(results.c.outcome)
            ).all()
        )
        row = connection.execute(
            select(func.sum(counters.c.used), func.sum(counters.c.denied_count))
        ).one()
    return outcomes, (row[0] or 0, row[1] or 0)


def test_sixteen_threads_on_one_hard_limit_grant_exactly_its_maximum(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=1000, period="1d", window="calendar"))
    sizes = batch_sizes(meter)

    def caller(thread: int) -> list[Decision]:
        return [meter.consume("org-1", "api", event_id=f"t{thread}-{n}") for n in range(500)]

    with ThreadPoolExecutor(16) as pool:
        decisions = [d for found in pool.map(caller, range(16)) for d in found]

    assert len(decisions) == 8000
    assert sum(d.allowed for d in decisions) == 1000
    assert not any(d.duplicate for d in decisions)
    assert len({d.event_id for d in decisions}) == 8000
    outcomes, (used, denied) = totals(meter)
    assert outcomes == {"allowed": 1000, "denied": 7000}
    assert (used, denied) == (1000, 7000)
    assert max(sizes) > 1, "no two calls ever shared a transaction"
    assert sum(sizes) == 8000


@contextmanager
def write_lock_held(url: str) -> Iterator[None]:
    """Hold the write lock of ``results`` from another connection."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            if engine.dialect.name == "sqlite":
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                connection.execute(text("BEGIN"))
                connection.execute(text("LOCK TABLE results IN EXCLUSIVE MODE"))
            try:
                yield
            finally:
                connection.exec_driver_sql("ROLLBACK")
    finally:
        engine.dispose()


def one_shared_batch(
    meter: Meter, calls: Sequence[Callable[[], Decision]]
) -> tuple[list[Future[Decision]], list[int]]:
    """Run ``calls`` from threads so that all but a first blocker share one batch."""
    sizes = batch_sizes(meter)
    pool = ThreadPoolExecutor(len(calls) + 1)
    with write_lock_held(meter.url):
        blocker = pool.submit(meter.consume, "org-0", "api", event_id="blocker")
        deadline = time.monotonic() + 10
        while not sizes and time.monotonic() < deadline:  # the leader is in its batch
            time.sleep(0.005)
        futures = [pool.submit(call) for call in calls]
        while len(meter._engine._group._waiting) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(meter._engine._group._waiting) == len(calls)
    assert blocker.result(timeout=30).allowed
    for future in futures:
        future.exception(timeout=30)
    pool.shutdown()
    return futures, sizes


def test_a_statement_the_database_refuses_fails_only_its_caller(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
    with meter.sql_engine.begin() as connection:  # a real refusal, by the database itself
        if meter.sql_engine.dialect.name == "sqlite":
            connection.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON results "
                "WHEN NEW.event_id = 'poison' BEGIN SELECT RAISE(ABORT, 'refused poison'); END"
            )
        else:
            connection.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.event_id = 'poison' THEN RAISE EXCEPTION 'refused poison'; END IF; "
                "RETURN NEW; END $$"
            )
            connection.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON results "
                "FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
    ids = [f"e{n}" for n in range(7)] + ["poison"] + [f"e{n}" for n in range(7, 14)]

    def call(event_id: str) -> Callable[[], Decision]:
        return lambda: meter.consume(f"org-{event_id}", "api", 2, event_id=event_id)

    futures, sizes = one_shared_batch(meter, [call(i) for i in ids])

    assert sizes[1] == len(ids), "the calls did not share a batch"
    for event_id, future in zip(ids, futures, strict=True):
        if event_id == "poison":
            error = future.exception()
            assert isinstance(error, StorageError)
            assert "refused poison" in str(error)
        else:
            decision = future.result()
            assert decision.event_id == event_id
            assert decision.allowed and not decision.duplicate
            assert decision.charges[0].subject == f"org-{event_id}"
            assert decision.charges[0].used == 2
    outcomes, (used, _) = totals(meter)
    assert outcomes == {"allowed": 1 + 14}  # the blocker and every call but the poison
    assert used == 1 + 2 * 14
    assert meter.result("poison") is None


def test_an_unacceptable_event_in_a_shared_batch_fails_only_its_caller(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
    calls: list[Callable[[], Decision]] = [
        lambda: meter.consume("org-1", "api", event_id="a"),
        lambda: meter.consume("org-1", "nope", event_id="b"),
        lambda: meter.consume("org-1", "api", event_id="c"),
    ]
    futures, sizes = one_shared_batch(meter, calls)

    assert sizes[1] == 3
    assert isinstance(futures[1].exception(), UnknownLimit)
    assert [futures[0].result().event_id, futures[2].result().event_id] == ["a", "c"]
    assert futures[2].result().charges[0].used == 2
    assert meter.result("b") is None


def test_a_repeated_id_in_one_batch_is_answered_as_consume_answers_it(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
    calls: list[Callable[[], Decision]] = [
        lambda: meter.consume("org-1", "api", event_id="same"),
        lambda: meter.consume("org-1", "api", event_id="same"),
        lambda: meter.consume("org-1", "api", 5, event_id="same"),
    ]
    futures, sizes = one_shared_batch(meter, calls)

    assert sizes[1] == 3
    first, second = futures[0].result(), futures[1].result()
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.charges == first.charges
    assert isinstance(futures[2].exception(), EventConflict)
    _, (used, _) = totals(meter)
    assert used == 2  # the blocker and "same", once


def test_without_group_commit_each_call_is_its_own_transaction(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOW), group_commit=False) as meter:
        meter.set_limit(Limit("api", maximum=10, period="1d", window="calendar"))
        sizes = batch_sizes(meter)
        with ThreadPoolExecutor(4) as pool:
            found = list(pool.map(lambda n: meter.consume("s", "api", event_id=f"x{n}"), range(20)))
        assert sum(d.allowed for d in found) == 10
        assert sizes == []


def test_aconsume_shares_transactions_without_blocking_the_loop(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
    sizes = batch_sizes(meter)

    async def main() -> tuple[list[Decision], int]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        decisions = await asyncio.gather(
            *(meter.aconsume("org-1", "api", event_id=f"a{n}") for n in range(300))
        )
        done = True
        await task
        return list(decisions), ticks

    decisions, ticks = asyncio.run(main())

    assert sum(d.allowed for d in decisions) == 100
    assert [d.event_id for d in decisions] == [f"a{n}" for n in range(300)]
    assert max(sizes) > 1
    assert ticks > len(sizes)  # the loop kept running while batches were applied
    _, (used, denied) = totals(meter)
    assert (used, denied) == (100, 200)


def test_aconsume_raises_the_callers_own_errors(meter: Meter) -> None:
    meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))

    async def main() -> None:
        with pytest.raises(InvalidInput):
            await meter.aconsume("org-1", "api", cost=0)
        with pytest.raises(UnknownLimit):
            await meter.aconsume("org-1", "nope")
        await meter.aconsume("org-1", "api", event_id="x")
        with pytest.raises(EventConflict):
            await meter.aconsume("org-1", "api", 3, event_id="x")

    asyncio.run(main())
    assert meter.result("x") is not None


def test_a_group_keeps_working_after_a_thread_is_interrupted(meter: Meter) -> None:
    """A caller that waits is always answered, even when calls fail around it."""
    meter.set_limit(Limit("api", maximum=5, period="1d", window="calendar"))
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            if n % 3 == 0:
                meter.consume("org-1", "nope", event_id=f"n{n}")
            else:
                meter.consume("org-1", "api", event_id=f"n{n}")
        except UnknownLimit:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    outcomes, _ = totals(meter)
    assert outcomes == {"allowed": 5, "denied": 35}
