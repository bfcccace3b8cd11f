"""The hot path's own psycopg connections to PostgreSQL.

`DirectPostgres` runs the hot path's transactions (`consume`, `aconsume`'s
groups, batches) and `check`'s one statement on psycopg connections of its
own, with no SQLAlchemy `Connection`, transaction or pool checkout: a
``PostgresHotStore`` on a pooled connection, the driver's errors judged and
retried exactly as `metering.storage.connections.run_retry_aware` judges
SQLAlchemy's (`retry_or_raise`); notices, forecasts and breakers are
written by the store with the rest (`metering.storage.hot.extras`).

The pool is this module's, not ``psycopg_pool``'s: that one opens
connections in background threads and makes a caller wait up to its timeout
while a worker retries an unreachable server; here, as in SQLAlchemy's
``QueuePool``, a caller that finds no idle connection opens one itself, so
an unreachable database fails the call at once with the driver's message
(`DatabaseUnavailable`, as before). Its connections take their places in
the engine's `ConnectionBudget` (`budget_of`: the process's one budget,
shared with SQLAlchemy's pool); it opens its share of the budget at most
(`shares`), keeps them open, and makes them with the engine's connect arguments
(`connect_args_of`).

Connections stay in autocommit: a transaction is begun and committed by
statements the store sends in its pipelines (``BEGIN`` with the first,
``COMMIT`` with the write: `PostgresHotStore`), each pipeline one wait for
the server; a connection given back inside a transaction is closed, never
lent again.

Connections are prepared as psycopg does by default (a statement is
prepared on the server from its fifth run on a connection,
``prepare_threshold``); results come back in binary (`PostgresHotStore`).

A process forked from this one never uses its parent's connections (a
Celery prefork child, a test's child): it leaves them open and untouched
(closing one would end the parent's session on the server) and opens its
own. `close` closes the idle connections, and the busy ones when they come
back. After a connection is found broken (a restart of the server), every
idle one is closed too: they all died with it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
import sqlalchemy.exc
from psycopg.pq import TransactionStatus
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError, StatementError

from metering.storage.budget import ConnectionBudget
from metering.storage.connections import (
    RetryTransaction,
    budget_of,
    connect_args_of,
    retry_or_raise,
    shares,
    translate,
)
from metering.storage.hot.postgres import PostgresHotStore

T = TypeVar("T")

# psycopg's default: a statement is prepared on the server from its 5th run.
PREPARE_THRESHOLD: Final = 5


class DirectPostgres:
    """The hot path's own psycopg connections to one PostgreSQL database (see the module)."""

    def __init__(
        self,
        params: dict[str, Any],
        *,
        idle: int = 5,
        size: int = 15,
        timeout: float = 30.0,
        prepare_threshold: int | None = PREPARE_THRESHOLD,
        budget: ConnectionBudget | None = None,
    ) -> None:
        self.params = params
        self.budget = budget or ConnectionBudget(size, timeout=timeout)
        self.idle = max(1, idle)
        self.size = max(1, size)
        self.timeout = timeout
        self.prepare_threshold = prepare_threshold
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: deque[psycopg.Connection[Any]] = deque()
        self._open: set[psycopg.Connection[Any]] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.size)
        self._closed = False

    @classmethod
    def for_engine(cls, engine: Engine) -> DirectPostgres | None:
        """For a PostgreSQL engine on psycopg, on its connection budget; None otherwise."""
        if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
            return None
        args, params = engine.dialect.create_connect_args(engine.url)
        if args:
            return None
        params = {**params, **connect_args_of(engine)}
        budget = budget_of(engine)
        if budget is None:
            return None
        share = shares(budget.size)[1]
        return cls(params, idle=share, size=share, timeout=budget.timeout, budget=budget)

    # -- connections -------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        raw = self.budget.connect(lambda: psycopg.Connection.connect(**self.params))
        raw.prepare_threshold = self.prepare_threshold
        raw.autocommit = True
        with self._lock:
            self._open.add(raw)
        return raw

    def _checkout(self) -> psycopg.Connection[Any]:
        """A connection of this process; raises SQLAlchemy's errors (for
        `retry_or_raise`) when none comes free in time or none can be opened.
        After `close` connections are still lent, and closed when they come back."""
        if self._pid != os.getpid():  # forked: the parent's connections stay untouched
            _ABANDONED.extend(self._open)
            self._reset()
        if not self._slots.acquire(timeout=self.timeout):
            raise sqlalchemy.exc.TimeoutError(
                f"the hot path's {self.size} connections stayed busy, timeout {self.timeout:.2f}"
            )
        try:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
            return self._connect()
        except psycopg.Error as exc:
            self._slots.release()
            # As SQLAlchemy reports a failed connect: not retried.
            raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc
        except BaseException:
            self._slots.release()
            raise

    def _checkin(self, raw: psycopg.Connection[Any]) -> None:
        """Give ``raw`` back: kept idle when it is usable and there is room, else closed."""
        try:
            status = raw.info.transaction_status
            if status != TransactionStatus.IDLE or raw.closed:
                self._discard(raw, broken=status == TransactionStatus.UNKNOWN)
                return
            if not raw.autocommit:
                raw.autocommit = True
            with self._lock:
                if not self._closed and len(self._idle) < self.idle:
                    self._idle.append(raw)
                    return
            self._discard(raw)
        finally:
            self._slots.release()

    def _discard(self, raw: psycopg.Connection[Any], *, broken: bool = False) -> None:
        """Close ``raw``; when it broke, the idle ones too (the server went away)."""
        dropped = [raw]
        with self._lock:
            if broken:
                dropped.extend(self._idle)
                self._idle.clear()
            for connection in dropped:
                self._open.discard(connection)
        for connection in dropped:
            connection.close()
            self.budget.closed(connection)

    def close(self) -> None:
        """Close every connection of this process (those in use when they come back)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
            for raw in idle:
                self._open.discard(raw)
        for raw in idle:
            raw.close()
            self.budget.closed(raw)

    @property
    def open_connections(self) -> int:
        """How many connections this process has open (idle or in use)."""
        return len(self._open) if self._pid == os.getpid() else 0

    # -- running -------------------------------------------------------------------

    def run(
        self,
        work: Callable[[PostgresHotStore, bool], T],
        *,
        attempts: int = 10,
    ) -> T:
        """Run ``work(store, retry)`` in one transaction on a pooled connection,
        committed when it returns (unless ``work`` committed it already: the
        store's write carries the COMMIT); run again as `run_retry_aware`
        would (serialization failures, deadlocks, a key written meanwhile, a
        broken connection, `RetryTransaction`), with ``retry`` true from the
        second run on; driver errors raised as `metering.errors` exceptions.
        Anything else ``work`` raises rolls back and propagates.

        The connection (``store.raw``) is in autocommit: the store's first
        pipeline begins the transaction (`PostgresHotStore.begins`); a
        statement ``work`` runs on it directly is its own transaction."""
        for attempt in range(attempts):
            try:
                raw = self._checkout()
            except SQLAlchemyError as exc:
                retry_or_raise(exc, attempt, attempts)
                continue
            try:
                try:
                    result = work(PostgresHotStore(raw), attempt > 0)
                    if raw.info.transaction_status != TransactionStatus.IDLE:
                        raw.commit()
                except BaseException:
                    _rollback(raw)
                    raise
            except (RetryTransaction, StatementError) as exc:
                self._checkin(raw)
                retry_or_raise(exc, attempt, attempts)
                continue
            except psycopg.Error as exc:  # the COMMIT itself
                self._checkin(raw)
                retry_or_raise(_translate(exc), attempt, attempts)
                continue
            except BaseException:
                self._checkin(raw)
                raise
            self._checkin(raw)
            return result
        raise AssertionError("unreachable")

    @contextmanager
    def autocommit(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit, for work of one statement (`check`).

        Not retried: driver errors (raw, or as `PostgresHotStore` raises
        them) come out as `metering.errors.StorageError`."""
        try:
            raw = self._checkout()
        except SQLAlchemyError as exc:
            raise translate(exc) from exc
        try:
            yield raw
        except psycopg.Error as exc:
            raise translate(_translate(exc)) from exc
        except StatementError as exc:
            raise translate(exc) from exc
        finally:
            self._checkin(raw)


def _rollback(raw: psycopg.Connection[Any]) -> None:
    """End a failed transaction; a connection that cannot is closed (and dropped at checkin)."""
    if raw.closed or raw.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        raw.rollback()
    except psycopg.Error:
        raw.close()


def _translate(exc: psycopg.Error) -> StatementError:
    broken = isinstance(exc, psycopg.OperationalError) or exc.sqlstate is None
    return DBAPIError.instance(None, None, exc, psycopg.Error, connection_invalidated=broken)


# Connections a forked child inherited: kept referenced so that they are
# never closed (nor finalised) in the child.
_ABANDONED: list[psycopg.Connection[Any]] = []
