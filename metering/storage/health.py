"""Liveness in the database: what ``metering status`` reads, and heartbeats.

`DatabaseProbe` reads whether the database answers, its Alembic revision beside the one this
code needs, heartbeats and which events have results; it never creates or upgrades anything
(a SQLite file that does not exist is reported so, not made). `record_heartbeat`: a worker
(role `WORKER`, named by its Celery node name) or beat (`BEAT`) says it is alive about every
`HEARTBEAT_INTERVAL_SECONDS`; each write opens and closes its own connection, so a forked
process shares none and a database that was away is simply tried again next time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from sqlalchemy import Connection, Engine, create_engine, delete, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from metering.clock import Clock
from metering.domain.instants import to_us
from metering.errors import ConfigurationError
from metering.storage import tables
from metering.storage.connections import (
    APPLICATION_NAME,
    MIGRATIONS_DIR,
    current_revision,
    ensure_schema,
    make_engine,
    normalise_url,
    translate,
)
from metering.storage.database import Database
from metering.storage.limits import LimitStore
from metering.storage.schema_revision import SCHEMA_REVISION
from metering.storage.store import Store

T = TypeVar("T")

WORKER: Final = "worker"
BEAT: Final = "beat"
HEARTBEAT_INTERVAL_SECONDS: Final = 10.0
# A process is alive while its last heartbeat is at most this old.
ALIVE_WITHIN_SECONDS: Final = 3 * HEARTBEAT_INTERVAL_SECONDS
# Rows of processes gone this long are deleted by the next heartbeat.
FORGET_AFTER_US: Final = 7 * 86_400 * 1_000_000
DEFAULT_CONNECT_TIMEOUT_SECONDS: Final = 5.0


@dataclass(frozen=True, slots=True)
class SchemaState:
    """The database's schema: ``revision`` None when it has none.

    ``exists`` is False for a SQLite file not created yet. ``known`` says
    whether this code's migrations know ``revision`` (a newer release's is
    unknown).
    """

    dialect: str
    exists: bool
    revision: str | None
    head: str
    known: bool

    @property
    def at_head(self) -> bool:
        return self.revision == self.head


def engine_options(url: str, connect_timeout_seconds: float) -> dict[str, Any]:
    """Options that bound how long connecting to a server may take."""
    if make_url(normalise_url(url)).get_backend_name() == "postgresql":
        # libpq counts whole seconds, and at least 2.
        return {"connect_args": {"connect_timeout": max(2, round(connect_timeout_seconds))}}
    return {}


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for other databases and in-memory ones)."""
    try:
        parsed = make_url(normalise_url(url))
    except (ArgumentError, ValueError):
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


@contextmanager
def _engine(url: str, connect_timeout_seconds: float) -> Iterator[Engine]:
    engine = make_engine(url, **engine_options(url, connect_timeout_seconds))
    try:
        yield engine
    finally:
        engine.dispose()


def _known_revisions() -> set[str]:
    # Imported here: a worker and `metering serve` never need Alembic.
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """A PostgreSQL server's client connections: ``metering``'s (those whose
    application name starts with it), all of them, ``max_connections`` and the
    places kept for superusers."""

    metering: int
    in_use: int
    max: int
    reserved: int

    @property
    def room(self) -> int:
        """How many more clients (not superusers) the server takes now."""
        return self.max - self.reserved - self.in_use


CONNECTION_COUNTS: Final = text(
    "SELECT count(*) FILTER (WHERE application_name LIKE :name), count(*),"
    " current_setting('max_connections')::int,"
    " current_setting('superuser_reserved_connections')::int"
    " FROM pg_stat_activity WHERE backend_type = 'client backend'"
)


class DatabaseProbe:
    """Read-only looks at a metering database, on one engine; creates nothing.

    `schema` raises `DatabaseUnavailable` (or another `StorageError`) when
    the database does not answer, `ConfigurationError` for a URL that is not
    one. A SQLite file that does not exist yet has no schema, no heartbeats
    and no results.
    """

    def __init__(
        self, url: str, *, connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS
    ) -> None:
        self.url = url
        file = sqlite_file(url)
        self.exists = file is None or file.exists()
        if not self.exists and file is not None and not file.parent.is_dir():
            raise ConfigurationError(f"the directory of {file} does not exist")
        self.engine: Engine | None = None
        if not self.exists:
            return
        if file is not None:
            # A plain engine: reads in WAL mode wait for no writer (metering's
            # own engines begin IMMEDIATE, and wait up to a minute for the lock).
            timeout = {"timeout": connect_timeout_seconds}
            self.engine = create_engine(f"sqlite:///{file}", connect_args=timeout)
        else:
            self.engine = make_engine(url, **engine_options(url, connect_timeout_seconds))

    def schema(self) -> SchemaState:
        """The schema's revision beside the one this code needs."""
        if self.engine is None:
            return SchemaState("sqlite", False, None, SCHEMA_REVISION, True)
        revision = current_revision(self.engine)
        known = revision is None or revision in _known_revisions()
        return SchemaState(self.engine.dialect.name, True, revision, SCHEMA_REVISION, known)

    def _read(self, table: str, work: Callable[[Connection], T], empty: T) -> T:
        if self.engine is None:
            return empty
        try:
            with self.engine.connect() as connection:
                if not inspect(connection).has_table(table):
                    return empty
                return work(connection)
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    def connections(self) -> ConnectionCounts | None:
        """The server's client connections: metering's (by application name),
        all, and the most it takes; None on SQLite."""
        if self.engine is None or self.engine.dialect.name != "postgresql":
            return None
        with self.engine.connect() as connection:
            row = connection.execute(CONNECTION_COUNTS, {"name": f"{APPLICATION_NAME}%"}).one()
        return ConnectionCounts(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

    def heartbeats(self, role: str) -> dict[str, int]:
        """When each process of ``role`` was last seen: name -> microseconds since
        the epoch; empty while there is no heartbeats table (a schema behind)."""
        table = tables.heartbeats
        query = select(table.c.name, table.c.seen_at_us).where(table.c.role == role)

        def work(connection: Connection) -> dict[str, int]:
            return {row.name: int(row.seen_at_us) for row in connection.execute(query)}

        return self._read(table.name, work, {})

    def decided(self, event_ids: Iterable[str]) -> set[str]:
        """Which of these event ids have a result."""
        wanted = list(event_ids)
        return self._read("results", lambda c: Store(c).decided_ids(wanted), set())

    def limit_names(self) -> frozenset[str] | None:
        """The names of the defined limits; None while there is no limits table."""
        names: frozenset[str] | None = self._read(
            "limits", lambda c: LimitStore(c).limit_names(), None
        )
        return names

    def rejected_since(self, since_us: int) -> int:
        """Dead letters (rejected events and messages) kept at or after ``since_us``."""
        return self._read("rejected_messages", lambda c: Store(c).count_rejected_since(since_us), 0)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None


# -- heartbeats ----------------------------------------------------------------------


def _upsert(connection: Connection, role: str, name: str, now_us: int) -> None:
    module: Any = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = module.insert(tables.heartbeats).values(role=role, name=name, seen_at_us=now_us)
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=["role", "name"], set_={"seen_at_us": now_us}
        )
    )
    connection.execute(
        delete(tables.heartbeats).where(tables.heartbeats.c.seen_at_us < now_us - FORGET_AFTER_US)
    )


def record_heartbeat(
    url: str,
    role: str,
    name: str,
    clock: Clock,
    *,
    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
) -> None:
    """Write that ``name`` (a ``role``) is alive at the clock's now.

    A SQLite database gets its schema first, as a `Meter` would give it; an
    outdated PostgreSQL schema raises `SchemaOutdated`.
    """
    now_us = to_us(clock(), field_name="clock")
    with _engine(url, connect_timeout_seconds) as engine:
        ensure_schema(engine)
        Database(engine, clock).run(lambda connection: _upsert(connection, role, name, now_us))


def forget_heartbeat(
    url: str,
    role: str,
    name: str,
    *,
    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
) -> None:
    """Delete the heartbeat of ``name``: it stopped on purpose."""
    table = tables.heartbeats
    gone = delete(table).where(table.c.role == role, table.c.name == name)
    with _engine(url, connect_timeout_seconds) as engine:
        Database(engine).run(lambda connection: connection.execute(gone))
