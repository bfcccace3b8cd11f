"""`Database`: an engine and a clock, shared by everything that stores or reads.

`Meter`, the webhooks, the reports and retention each take one (or anything
with a ``database`` attribute, such as a `Meter`), and run their transactions
through `Database.run`; nothing above storage touches an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from metering.clock import Clock, system_clock
from metering.domain.instants import to_us
from metering.storage.connections import (
    READ_ONLY,
    budget_of,
    make_engine,
    run_read,
    run_retry_aware,
    run_transaction,
    translate,
)

T = TypeVar("T")


class Database:
    """An engine and the clock every "now" comes from."""

    def __init__(self, engine: Engine, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or system_clock

    @classmethod
    def connect(cls, url: str, clock: Clock | None = None, **engine_options: Any) -> Database:
        """A database on ``url`` (see `make_engine`); nothing is connected yet."""
        return cls(make_engine(url, **engine_options), clock)

    def now(self) -> datetime:
        return self.clock()

    def now_us(self) -> int:
        """The clock's now in microseconds since the epoch (`OccurredAtOutOfRange` if absurd)."""
        return to_us(self.clock(), field_name="clock")

    def run(self, work: Callable[[Connection], T], *, attempts: int = 10) -> T:
        """Run ``work`` in one transaction, retried on conflicts (`run_transaction`)."""
        return run_transaction(self.engine, work, attempts=attempts)

    def read(self, work: Callable[[Connection], T], *, attempts: int = 10) -> T:
        """`run` for work that only reads (`run_read`: on SQLite no write lock)."""
        return run_read(self.engine, work, attempts=attempts)

    def run_retry_aware(self, work: Callable[[Connection, bool], T], *, attempts: int = 10) -> T:
        """`run`, telling ``work`` whether it is a retry (`run_retry_aware`)."""
        return run_retry_aware(self.engine, work, attempts=attempts)

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection outside a retried transaction, for streaming reads;
        driver errors come out as `metering.errors` exceptions. It only reads:
        on SQLite its transaction takes no write lock, so writers go on while
        a reader (a report streamed to a slow client) takes its time."""
        try:
            with self.engine.connect() as connection:
                connection.execution_options(**{READ_ONLY: True})
                yield connection
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    def connections_in_use(self) -> int | None:
        """How many connections this process has open to PostgreSQL on the
        engine's budget (every path's together); None on SQLite."""
        budget = budget_of(self.engine)
        return None if budget is None else budget.in_use

    def dispose(self, *, close: bool = True) -> None:
        self.engine.dispose(close=close)


class HasDatabase(Protocol):
    """Anything that works on a `Database` (a `Meter`)."""

    @property
    def database(self) -> Database: ...


DatabaseSource = Database | HasDatabase


def database_of(source: DatabaseSource) -> Database:
    """The `Database` itself, or the one a `Meter` works on."""
    return source if isinstance(source, Database) else source.database
