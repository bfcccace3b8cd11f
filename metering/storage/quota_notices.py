"""Quota-change notices: a reset or a changed maximum, told to every process.

`notify` runs inside the transaction that makes the change: PostgreSQL
delivers a ``NOTIFY`` on `CHANNEL` at commit, never for a rolled-back one.
On SQLite it does nothing (a process's leases see the change at their next
renewal). `QuotaListener` is a process's one listening connection (a place
in the engine's `ConnectionBudget`): it calls ``on_change(subject, limit)``
for each notice on a thread of its own, None standing for "every"; after
its connection was lost and made again it calls ``on_change(None, None)``:
notices may have been missed meanwhile.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

import psycopg
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from metering.errors import DatabaseUnavailable
from metering.storage.budget import ConnectionBudget
from metering.storage.connections import budget_of, connect_args_of, translate

log = logging.getLogger("metering.leases")

CHANNEL: Final = "metering_quota"
POLL_SECONDS: Final = 0.25
RECONNECT_SECONDS: Final = 1.0

OnChange = Callable[[str | None, str | None], None]


def notify(connection: Connection, subject: str | None, limit: str | None) -> None:
    """Tell every listening process, once this transaction commits, that
    (subject, limit)'s maximum or counters changed (None: every one)."""
    if connection.dialect.name == "postgresql":
        payload = json.dumps([subject, limit])
        connection.execute(select(func.pg_notify(CHANNEL, payload)))


def parse(payload: str) -> tuple[str | None, str | None]:
    """A notice's (subject, limit); (None, None) for one that is not ours."""
    try:
        subject, limit = json.loads(payload)
    except (ValueError, TypeError):
        return None, None
    if not all(part is None or isinstance(part, str) for part in (subject, limit)):
        return None, None
    return subject, limit


class QuotaListener:
    """One connection listening on `CHANNEL`, and its thread (see the module)."""

    def __init__(self, params: dict[str, Any], budget: ConnectionBudget, on_change: OnChange):
        self._params = params
        self._budget = budget
        self._on_change = on_change
        self._stop = threading.Event()
        self._raw: psycopg.Connection[Any] | None = self._connect()  # listening on return
        self._thread = threading.Thread(target=self._run, name="metering-notices", daemon=True)
        self._thread.start()

    @classmethod
    def for_engine(cls, engine: Engine, on_change: OnChange) -> QuotaListener | None:
        """A listener on a PostgreSQL engine's database (None on SQLite), listening
        on return; `DatabaseUnavailable` (or another `StorageError`) if it cannot."""
        budget = budget_of(engine)
        if budget is None or engine.dialect.driver != "psycopg":
            return None
        args, params = engine.dialect.create_connect_args(engine.url)
        if args:
            return None
        try:
            return cls({**params, **connect_args_of(engine)}, budget, on_change)
        except psycopg.Error as exc:
            raise DatabaseUnavailable(str(exc).strip() or type(exc).__name__) from exc
        except SQLAlchemyError as exc:  # no place in the budget in time
            raise translate(exc) from exc

    def _connect(self) -> psycopg.Connection[Any]:
        params = {**self._params, "autocommit": True}
        raw = self._budget.connect(lambda: psycopg.Connection.connect(**params))
        try:
            raw.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error:
            self._drop(raw)
            raise
        return raw

    def _drop(self, raw: psycopg.Connection[Any]) -> None:
        raw.close()
        self._budget.closed(raw)

    @property
    def listening(self) -> bool:
        """Whether notices reach this process now (else none may be relied on)."""
        return self._raw is not None and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # the thread lives on: a lost server comes back
                log.warning("the quota listener stopped listening: %s", exc)
                raw, self._raw = self._raw, None
                if raw is not None:
                    self._drop(raw)
                self._on_change(None, None)  # nothing is heard until it listens again
                self._stop.wait(RECONNECT_SECONDS)

    def _listen(self) -> None:
        if self._raw is None:
            self._raw = self._connect()
            self._on_change(None, None)  # what was missed meanwhile
        for notice in self._raw.notifies(timeout=POLL_SECONDS):
            self._on_change(*parse(notice.payload))

    def close(self) -> None:
        """Stop listening and close the connection."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        if self._raw is not None:
            self._drop(self._raw)
            self._raw = None
