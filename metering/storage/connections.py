"""Engines, schema version checks, transactions with retries, error translation.

Dialect differences live here and in the stores' statements (`metering.storage.counters`,
`metering.storage.results`, `metering.storage.hot`). SQLite runs in WAL mode and starts
every transaction with ``BEGIN IMMEDIATE``: writers queue on the database lock
(``busy_timeout``) instead of failing when a read transaction upgrades to a write.
PostgreSQL runs at READ COMMITTED, counters locked by the upsert itself. `run_transaction`
retries serialization failures and deadlocks (`RETRYABLE_SQLSTATES`); `translate` makes
driver errors `StorageError`s. `ensure_schema` wants `SCHEMA_REVISION`: it upgrades a
SQLite file, and refuses an older PostgreSQL schema (``metering db upgrade``).
"""

from __future__ import annotations

import math
import random
import sqlite3
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.util import LRUCache

from metering.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InputRefused,
    SchemaOutdated,
    StorageError,
)
from metering.settings import connection_budget, db_connections
from metering.settings import sqlite_synchronous as sqlite_synchronous
from metering.storage.budget import ConnectionBudget
from metering.storage.schema_revision import SCHEMA_REVISION
from metering.telemetry.metrics import count_db_error, count_db_retry

T = TypeVar("T")

MIGRATIONS_DIR: Final = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS: Final = 60_000
# Serialization failure, deadlock, a lock timeout a transaction set for itself
# (an operator's reset yielding to consumes), and a key another transaction
# wrote first (the next run sees it stored; if it persists, it is refused).
RETRYABLE_SQLSTATES: Final = frozenset({"40001", "40P01", "55P03", "23505"})
_SQLITE_KEY_TAKEN: Final = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})


# The execution option of a connection that only reads (`Database.reading`):
# on SQLite its transaction is a deferred one, never in a writer's way.
READ_ONLY: Final = "metering_read_only"


class RetryTransaction(Exception):
    """Raised inside a transaction to roll it back and run it again."""


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` and use psycopg 3 for them."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, *, connections: int | None = None, **kwargs: Any) -> Engine:
    """An engine set up for metering's transactions on SQLite or PostgreSQL.

    On PostgreSQL every connection of the engine, and of the paths that
    share its budget (`budget_of`), takes a place in one `ConnectionBudget`
    of ``connections`` (default ``METERING_DB_CONNECTIONS``)."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            return _shared_statements(_sqlite_engine(url, **kwargs))
        if parsed.get_backend_name() != "postgresql":
            raise ConfigurationError(f"unsupported database {parsed.get_backend_name()!r}")
        budget = (
            db_connections()
            if connections is None
            else connection_budget(connections, "connections")
        )
        return _shared_statements(_postgres_engine(url, budget, kwargs))
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigurationError(f"invalid database URL {url!r}: {exc}") from exc


# What a dialect's compiler reads, once the dialect has seen its first
# connection: its class, and its settings of plain values (the server's
# version, paramstyle, schema, flags ...) and JSON functions.
_DIALECT_SETTINGS: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_PLAIN: Final = (str, int, float, bool, type(None), tuple)


def _settings_of(dialect: Any) -> tuple[Any, ...]:
    plain = sorted((k, v) for k, v in vars(dialect).items() if _is_plain(v))
    serializers = (dialect._json_serializer, dialect._json_deserializer)
    return (type(dialect), tuple(plain), *serializers)


def _is_plain(value: Any) -> bool:
    if not isinstance(value, _PLAIN):
        return False
    try:
        hash(value)  # (a tuple of lists is not)
    except TypeError:
        return False
    return True


class _SharedStatements(LRUCache[Any, Any]):
    """SQLAlchemy's compiled statements, one cache for every engine of the
    process: its key names the engine's dialect object, here replaced by
    the dialect's settings, so engines whose dialects are alike (every
    `Meter` on SQLite; on one PostgreSQL server) compile a statement once.
    A dialect not yet connected keeps its own key."""

    @staticmethod
    def _key(key: Any) -> Any:
        settings = _DIALECT_SETTINGS.get(key[0])
        return key if settings is None else (settings, *key[1:])

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._key(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(self._key(key), value)


_STATEMENTS: Final = _SharedStatements(capacity=1000)


def _shared_statements(engine: Engine) -> Engine:
    """``engine`` compiling into `_STATEMENTS`, its dialect's settings read
    on each new connection (after SQLAlchemy's first-connect set-up)."""

    dialect = engine.dialect

    @event.listens_for(engine, "connect")
    def _read_settings(_dbapi_connection: Any, _record: Any) -> None:
        _DIALECT_SETTINGS[dialect] = _settings_of(dialect)

    engine.update_execution_options(compiled_cache=_STATEMENTS)
    return engine


# The ``application_name`` of every connection metering opens to PostgreSQL,
# unless the URL names one.
APPLICATION_NAME: Final = "metering"


def shares(connections: int) -> tuple[int, int]:
    """How a budget of ``connections`` is split: the most SQLAlchemy's pool
    and the hot path each open; the one place left is the leases' listener's.
    Each path keeps what it opened (no connection closed to make room for the
    other path's, none opened past its share)."""
    sqlalchemy_share = max(1, (connections - 1) // 3)
    return sqlalchemy_share, max(1, connections - 1 - sqlalchemy_share)


def _postgres_engine(url: str, connections: int, kwargs: dict[str, Any]) -> Engine:
    budget = ConnectionBudget(connections, timeout=kwargs.get("pool_timeout", 30.0))
    # No pre-ping: it costs a round trip per transaction. A connection
    # that died while pooled fails its transaction, which is retried.
    kwargs.setdefault("pool_size", shares(connections)[0])
    kwargs.setdefault("max_overflow", 0)
    # No HSTORE column anywhere: skip the look-up of its type that the
    # dialect otherwise makes, a round trip, on each engine's first connection.
    kwargs.setdefault("use_native_hstore", False)
    connect_args = dict(kwargs.get("connect_args") or {})
    if "application_name" not in make_url(url).query:
        # How `metering status` (and an operator) finds this process's connections.
        connect_args.setdefault("application_name", APPLICATION_NAME)
        kwargs["connect_args"] = connect_args
    # Looked up when called: tracing wraps it (`metering.telemetry.tracing`).
    engine = sqlalchemy.create_engine(url, **kwargs)
    _CONNECT_ARGS[engine] = connect_args
    _BUDGETS[engine] = budget

    @event.listens_for(engine, "do_connect")
    def _on_connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return budget.connect(lambda: dialect.connect(*cargs, **cparams))

    @event.listens_for(engine, "close")
    def _on_close(dbapi_connection: Any, _record: Any) -> None:
        budget.closed(dbapi_connection)

    @event.listens_for(engine, "close_detached")
    def _on_close_detached(dbapi_connection: Any) -> None:
        budget.closed(dbapi_connection)

    return engine


# The ``connect_args`` each PostgreSQL engine was made with (`make_engine`),
# for the hot path's own connections (`metering.storage.hot.direct_postgres`).
_CONNECT_ARGS: weakref.WeakKeyDictionary[Engine, dict[str, Any]] = weakref.WeakKeyDictionary()
# The connection budget of each PostgreSQL engine, shared with the hot path
# and the leases' listener.
_BUDGETS: weakref.WeakKeyDictionary[Engine, ConnectionBudget] = weakref.WeakKeyDictionary()


def budget_of(engine: Engine) -> ConnectionBudget | None:
    """The connection budget of a PostgreSQL engine made by `make_engine` (else None)."""
    return _BUDGETS.get(engine)


def connect_args_of(engine: Engine) -> dict[str, Any]:
    """The ``connect_args`` ``engine`` was made with by `make_engine` (else none)."""
    return dict(_CONNECT_ARGS.get(engine, {}))


def sqlite_pragmas(connection: sqlite3.Connection, synchronous: str) -> None:
    """What every connection to a SQLite database runs first (also the hot
    path's own, `metering.storage.hot.sqlite.DirectSqlite`)."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    try:  # counters' rates decay with exp(): a build without math functions gets Python's
        cursor.execute("SELECT exp(0)")
    except sqlite3.OperationalError:
        connection.create_function("exp", 1, math.exp, deterministic=True)
    cursor.close()


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    synchronous = sqlite_synchronous()
    engine = sqlalchemy.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE itself.
        dbapi_connection.isolation_level = None
        sqlite_pragmas(dbapi_connection, synchronous)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        if connection.get_execution_options().get(READ_ONLY):
            # A reader (`Database.reading`): a WAL snapshot that takes no
            # write lock, so a long report never holds up a consume.
            connection.exec_driver_sql("BEGIN")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


# `metering_db_retries_total{reason}`: why a transaction ran again.
_RETRY_REASONS: Final = {
    "40001": "serialization",
    "40P01": "deadlock",
    "55P03": "lock_timeout",
    "23505": "key_taken",
}


def _retry_reason(exc: DBAPIError) -> str:
    reason = _RETRY_REASONS.get(getattr(exc.orig, "sqlstate", None) or "")
    if reason is not None:
        return reason
    if getattr(exc.orig, "sqlite_errorname", None) in _SQLITE_KEY_TAKEN:
        return "key_taken"
    return "connection" if exc.connection_invalidated else "busy"


def _failed(error: StorageError) -> StorageError:
    count_db_error(type(error).__name__)
    return error


def _is_retryable(exc: DBAPIError) -> bool:
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate in RETRYABLE_SQLSTATES:
        return True
    if getattr(exc.orig, "sqlite_errorname", None) in _SQLITE_KEY_TAKEN:
        return True
    return "database is locked" in str(exc.orig) or bool(exc.connection_invalidated)


def translate(exc: SQLAlchemyError) -> StorageError:
    """A driver error as one of ours, with the driver's message and no traceback noise."""
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    name = type(orig).__name__
    if _is_refusal(orig):
        return InputRefused(f"database refused the data: {message}")
    if name in {"OperationalError", "InterfaceError"} or "connection" in message.lower():
        return DatabaseUnavailable(f"database unavailable: {message}")
    return StorageError(f"database error: {message}")


# SQLSTATE classes of errors in the data, not in the server or the connection:
# 22 data exception (a NUL byte, a value out of range), 23 integrity constraint
# (after retries of key races), 54 program limit exceeded (a value too large).
_REFUSAL_CLASSES: Final = ("22", "23", "54")


def _is_refusal(orig: BaseException) -> bool:
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate[:2] in _REFUSAL_CLASSES
    return isinstance(orig, sqlite3.IntegrityError | sqlite3.DataError)


def run_transaction(engine: Engine, work: Callable[[Connection], T], *, attempts: int = 10) -> T:
    """Run ``work`` in one transaction; retry it on serialization failures,
    deadlocks, a busy SQLite database or a `RetryTransaction`."""
    return run_retry_aware(engine, lambda connection, _retry: work(connection), attempts=attempts)


def run_read(engine: Engine, work: Callable[[Connection], T], *, attempts: int = 10) -> T:
    """`run_transaction` for work that only reads: on SQLite its transaction
    is a snapshot that takes no write lock, so it neither waits for a writer
    nor holds one up (PostgreSQL reads the same either way)."""
    return run_retry_aware(
        engine, lambda connection, _retry: work(connection), attempts=attempts, read_only=True
    )


def run_retry_aware(
    engine: Engine,
    work: Callable[[Connection, bool], T],
    *,
    attempts: int = 10,
    read_only: bool = False,
) -> T:
    """`run_transaction` for work that runs differently when it is run again:
    ``work(connection, retry)`` gets ``retry=True`` from the second attempt on
    (for example to look up an event id it skipped the first time)."""
    for attempt in range(attempts):
        began = time.monotonic()
        try:
            with engine.connect() as connection:
                if read_only:
                    connection.execution_options(**{READ_ONLY: True})
                with connection.begin():
                    return work(connection, attempt > 0)
        except (RetryTransaction, SQLAlchemyError) as exc:
            retry_or_raise(exc, attempt, attempts, began=began)
        except OverflowError as exc:
            raise refused_overflow(exc) from exc
    raise AssertionError("unreachable")


def refused_overflow(exc: OverflowError) -> StorageError:
    """SQLite's driver refuses an integer past 64 bits before the database
    sees it (PostgreSQL answers "bigint out of range"): the `InputRefused`
    to raise for it (another ``exc`` is raised as it is)."""
    if "SQLite INTEGER" not in str(exc):
        raise exc
    return _failed(InputRefused(f"database refused the data: {exc}"))


def retry_or_raise(
    exc: RetryTransaction | SQLAlchemyError,
    attempt: int,
    attempts: int,
    *,
    began: float | None = None,
) -> None:
    """After ``attempt`` (from 0) of ``attempts`` failed with ``exc``: count
    the retry and back off, or raise ``exc`` as a `StorageError` when it is
    not worth another run or the attempts are spent. An attempt that began
    (``time.monotonic``) a whole SQLite busy timeout ago and found the
    database locked is not run again: another connection holds the write
    lock and has held it all that time."""
    if began is not None and _waited_out(exc, began):
        raise _failed(
            DatabaseUnavailable(
                "database is locked: another connection has held the SQLite database's write "
                f"lock for {SQLITE_BUSY_TIMEOUT_MS / 1000:g} s (a transaction left open?)"
            )
        ) from exc
    if isinstance(exc, RetryTransaction):
        if attempt == attempts - 1:
            raise _failed(StorageError("transaction kept conflicting; gave up")) from None
        reason = "requested"
    elif isinstance(exc, DBAPIError):
        if not _is_retryable(exc) or attempt == attempts - 1:
            raise _failed(translate(exc)) from exc
        reason = _retry_reason(exc)
    else:
        raise _failed(translate(exc)) from exc
    count_db_retry(reason)
    time.sleep(min(0.5, 0.005 * 2**attempt) * random.uniform(0.5, 1.5))


def _waited_out(exc: RetryTransaction | SQLAlchemyError, began: float) -> bool:
    locked = isinstance(exc, DBAPIError) and "database is locked" in str(exc.orig)
    return locked and time.monotonic() - began >= SQLITE_BUSY_TIMEOUT_MS / 1000


# One plain statement: a database without the table refuses it
# (`_no_such_table`), which costs less than looking the table up first.
_REVISION: Final = text("SELECT version_num FROM alembic_version")


def current_revision(engine: Engine) -> str | None:
    """The database's Alembic revision (None: no ``alembic_version`` table, or no row)."""
    try:
        with engine.connect() as connection:
            try:
                row = connection.execute(_REVISION).first()
            except DBAPIError as exc:
                if not _no_such_table(exc):
                    raise
                return None
            return row[0] if row else None
    except SQLAlchemyError as exc:
        raise translate(exc) from exc


def _no_such_table(exc: DBAPIError) -> bool:
    """Whether the database refused a statement for naming a table it lacks."""
    if getattr(exc.orig, "sqlstate", None) == "42P01":  # PostgreSQL's undefined_table
        return True
    return isinstance(exc.orig, sqlite3.OperationalError) and "no such table" in str(exc.orig)


def ensure_schema(engine: Engine) -> None:
    """Check the schema is current; an embedded SQLite database is created or upgraded."""
    revision = current_revision(engine)
    if revision == SCHEMA_REVISION:
        return
    if is_sqlite(engine):
        upgrade_schema(engine)
        return
    found = "no schema" if revision is None else f"schema revision {revision}"
    raise SchemaOutdated(
        f"the database has {found}, this version needs {SCHEMA_REVISION}: run `metering db upgrade`"
    )


def upgrade_schema(target: str | Engine) -> None:
    """Run the Alembic migrations up to head (``metering db upgrade``)."""
    from alembic import command
    from alembic.config import Config

    engine = make_engine(target) if isinstance(target, str) else target
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        raise translate(exc) from exc
    finally:
        if isinstance(target, str):
            engine.dispose()
