"""The PostgreSQL hot path on psycopg connections of its own (issue 20, point 2).

`consume`, `aconsume`, batches and `check` run on connections of
`metering.storage.hot.direct_postgres.DirectPostgres`, with no SQLAlchemy
`Connection`, transaction or pool checkout, notification marks included;
what needs SQLAlchemy (the limits' cache loaded) runs under it. These tests
hold that, and what a pool of connections must survive: a fork, a restart
of the server, more threads than connections, and `Meter.close`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg.pq import TransactionStatus
from servers import PostgresServer
from sqlalchemy import event, func, select

from metering import FrozenClock, Limit, Meter, make_event
from metering.errors import DatabaseUnavailable
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.storage.tables import counters, results, webhook_marks

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LIMITS = [
    Limit("calls", maximum=1_000, period="1d", window="calendar"),
    Limit("trial", maximum=1_000, period="1h", window="first_use"),
    Limit("burst", maximum=1_000, period="1m", algorithm="token_bucket"),
]


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url, clock=FrozenClock(NOW)) as m:
        m.set_limits(LIMITS)
        yield m


def direct_of(meter: Meter) -> Any:
    from metering.storage.hot.direct_postgres import DirectPostgres

    direct = meter._engine.direct
    assert isinstance(direct, DirectPostgres)
    return direct


def checkouts(meter: Meter) -> list[int]:
    """How many connections the meter's SQLAlchemy pool lends from now on (one cell)."""
    count = [0]

    def counted(*_args: object) -> None:
        count[0] += 1

    event.listen(meter.sql_engine, "checkout", counted)
    return count


def used(meter: Meter) -> tuple[int, int]:
    with meter.sql_engine.connect() as connection:
        count = connection.execute(select(func.count()).select_from(results)).scalar_one()
        total = connection.execute(select(func.sum(counters.c.used))).scalar_one()
    return count, total or 0


def test_the_common_path_checks_out_no_sqlalchemy_connection(meter: Meter) -> None:
    meter.consume("warm-up", "calls")  # the limits' cache is loaded under SQLAlchemy
    lent = checkouts(meter)
    decisions = [meter.consume(f"s-{i % 3}", LIMITS[i % 3].name) for i in range(30)]
    checks = [meter.check(f"s-{i % 3}", LIMITS[i % 3].name) for i in range(6)]

    async def concurrently() -> list[Any]:
        return await asyncio.gather(*(meter.aconsume(f"a-{i}", "calls") for i in range(8)))

    decisions += asyncio.run(concurrently())
    with ThreadPoolExecutor(8) as pool:  # group commit
        decisions += pool.map(lambda i: meter.consume(f"t-{i % 4}", "trial"), range(40))
    events = [make_event([(f"b-{n % 7}", "calls", 1)], NOW, f"b{n}") for n in range(50)]
    meter.apply_records([e.record() for e in events[:25]])
    report = apply_batch(meter, encode_batch([encode_event(e) for e in events[25:]]))
    assert report.applied == 25
    assert all(d.allowed for d in decisions) and all(c.allowed for c in checks)
    assert lent == [0]
    assert used(meter) == (1 + 30 + 8 + 40 + 50, 1 + 30 + 8 + 40 + 50)


def test_a_notice_is_written_on_the_direct_connection(pg_url: str) -> None:
    # The first denial of a window leaves a notification mark, written by
    # the direct store with the rest: no SQLAlchemy connection is lent, and
    # nothing is written twice.
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("small", maximum=2, period="1d", window="calendar"))
        assert meter.consume("s", "small").allowed
        lent = checkouts(meter)
        assert meter.consume("s", "small").allowed
        assert lent == [0]
        assert not meter.consume("s", "small").allowed  # the first denial: a mark
        assert lent == [0]
        assert not meter.consume("s", "small").allowed
        with meter.sql_engine.connect() as connection:
            marks = connection.execute(select(func.count()).select_from(webhook_marks))
            assert marks.scalar_one() == 1
            denied = connection.execute(select(counters.c.denied_count)).scalar_one()
        assert denied == 2
        assert used(meter) == (4, 2)


def _apply_in_child(meter: Meter, parents: set[int], out: Any) -> None:
    try:
        decision = meter.consume("child", "calls")
        batch = [make_event([("child", "trial", 2)], NOW, f"c{n}").record() for n in range(5)]
        meter.apply_records(batch)
        check = meter.check("child", "burst")
        mine = {id(c) for c in direct_of(meter)._open}
        out.send((decision.allowed and check.allowed, bool(mine), bool(mine & parents)))
    finally:
        meter._engine.direct.close()  # type: ignore[union-attr]


def test_a_forked_process_opens_its_own_connections(meter: Meter) -> None:
    meter.consume("parent", "calls")
    direct = direct_of(meter)
    parents = {id(c) for c in direct._open}
    assert parents
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=_apply_in_child, args=(meter, parents, theirs))
    child.start()
    theirs.close()  # a child that dies early ends the pipe: recv raises EOFError
    assert ours.recv() == (True, True, False)
    child.join()
    assert child.exitcode == 0
    # The parent's connections were left alone: they still work.
    lent = checkouts(meter)
    assert {id(c) for c in direct._open} == parents
    assert meter.consume("parent", "calls").allowed
    assert meter.check("parent", "calls").allowed
    assert lent == [0]
    assert used(meter) == (8, 13)


def test_a_restart_of_the_server_fails_calls_clearly_then_they_work(
    meter: Meter, postgres_server: PostgresServer
) -> None:
    meter.consume("s", "calls")
    meter.check("s", "calls")
    try:
        postgres_server.stop()
        with pytest.raises(DatabaseUnavailable, match=r"^database unavailable: "):
            meter.consume("s", "calls")
        with pytest.raises(DatabaseUnavailable, match=r"^database unavailable: "):
            meter.apply_records([make_event([("s", "trial", 1)], NOW, "down").record()])
        with pytest.raises(DatabaseUnavailable, match=r"^database unavailable: "):
            meter.check("s", "calls")
    finally:
        postgres_server.start()
    # The connections that died with the server are dropped; new ones work.
    assert meter.consume("s", "calls").allowed
    assert meter.check("s", "calls").allowed
    assert meter.apply_records([make_event([("s", "trial", 1)], NOW, "up").record()])
    assert used(meter) == (3, 3)


def test_a_restart_between_calls_is_retried_on_a_new_connection(
    meter: Meter, postgres_server: PostgresServer
) -> None:
    meter.consume("s", "calls")
    postgres_server.stop()
    postgres_server.start()
    lent = checkouts(meter)
    assert meter.consume("s", "calls").allowed  # the pooled connection died: retried
    assert lent == [0]
    meter.database.dispose()  # SQLAlchemy's pooled connections died too (no pre-ping)
    assert used(meter) == (2, 2)


@pytest.mark.parametrize("group_commit", [True, False])
def test_sixteen_threads_on_one_connection_neither_deadlock_nor_miscount(
    pg_url: str, group_commit: bool
) -> None:
    # One connection for the hot path (and one for SQLAlchemy): 16 threads
    # consume, check, and some of their calls need SQLAlchemy (first denials
    # leave marks), so the direct path's connection and SQLAlchemy's are
    # both taken; a hard limit holds exactly.
    with Meter(
        pg_url,
        clock=FrozenClock(NOW),
        group_commit=group_commit,
        connections=3,  # one each, and one for the leases' listener
    ) as meter:
        meter.set_limits([Limit("hard", maximum=100, period="1d", window="calendar")])
        meter.consume("warm-up", "hard")
        assert direct_of(meter).size == 1

        def calls(thread: int) -> int:
            allowed = 0
            for n in range(25):
                allowed += meter.consume("shared" if n % 2 else f"own-{n % 5}", "hard").allowed
                if n % 5 == 0:
                    meter.check("shared", "hard")
            return allowed

        with ThreadPoolExecutor(16) as pool:
            allowed = sum(pool.map(calls, range(16)))
        assert direct_of(meter).open_connections <= 1
        with meter.sql_engine.connect() as connection:
            shared = connection.execute(
                select(counters.c.used, counters.c.denied_count).where(
                    counters.c.subject == "shared"
                )
            ).one()
    # 12 calls a thread on "shared" (100 allowed), 13 on subjects of their own (all allowed).
    assert tuple(shared) == (100, 16 * 12 - 100)
    assert allowed == 100 + 16 * 13


def test_close_closes_the_pool(pg_url: str) -> None:
    meter = Meter(pg_url, clock=FrozenClock(NOW))
    meter.set_limits(LIMITS)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: meter.consume(f"s-{i}", "calls"), range(40)))
    direct = direct_of(meter)
    opened = list(direct._open)
    assert opened
    meter.close()
    assert direct.open_connections == 0
    assert all(raw.closed for raw in opened)


def test_work_of_one_statement_runs_in_autocommit_and_is_retried(meter: Meter) -> None:
    # What the engine exposes for work on the driver (a server-side function
    # deciding one event): `run(work)` is one round trip per
    # statement, retried after a key taken as any transaction is.
    from psycopg import errors

    direct = direct_of(meter)
    seen: list[bool] = []

    def work(store: Any, retry: bool) -> int:
        seen.append(retry)
        assert store.raw.autocommit
        if not retry:
            raise errors.UniqueViolation("taken")  # as the driver raises it
        row = store.raw.execute("SELECT count(*) FROM results").fetchone()
        return int(row[0])

    assert direct.run(work) == 0
    assert seen == [False, True]
    with direct.autocommit() as raw:
        assert raw.autocommit
        assert raw.execute("SELECT 1").fetchone() == (1,)
    # Given back in autocommit and outside a transaction (the store begins the next).
    assert all(raw.autocommit for raw in direct._idle)
    assert all(raw.info.transaction_status == TransactionStatus.IDLE for raw in direct._idle)


def test_a_failed_write_rolls_back_and_the_connection_is_lent_again_outside_a_transaction(
    meter: Meter,
) -> None:
    # The store's BEGIN and COMMIT are statements of its pipelines on a
    # connection in autocommit: a statement failing in the write's pipeline
    # (here a counter created that exists: a unique violation, as when
    # another transaction created it meanwhile) leaves the transaction
    # aborted; `run` rolls it back and runs the work again, on a connection
    # in no transaction, holding no lock.
    from metering.storage.hot import Changes

    assert meter.consume("org", "calls").allowed
    direct = direct_of(meter)
    with direct.autocommit() as raw:
        key = raw.execute("SELECT limit_name, subject, window_start_us FROM counters").fetchone()
    statuses: list[tuple[bool, Any, bool]] = []

    def work(store: Any, retry: bool) -> int:
        raw = store.raw
        statuses.append((retry, raw.info.transaction_status, raw.autocommit))
        if not retry:
            created = (tuple(key), key[2] + 1, [1, 0, 0, None, None, 0, 1], None)
            store.write(Changes(created=[created]), 0, commit=True)
        return 1

    assert direct.run(work) == 1
    assert statuses == [(False, TransactionStatus.IDLE, True), (True, TransactionStatus.IDLE, True)]
    assert all(raw.info.transaction_status == TransactionStatus.IDLE for raw in direct._idle)
    with direct.autocommit() as raw:  # no lock left: the counter is free at once
        raw.execute("SET lock_timeout = '1s'")
        assert raw.execute("SELECT used FROM counters FOR UPDATE").fetchone() == (1,)
    assert meter.consume("org", "calls").allowed
