"""`ConnectionBudget`: the most connections one process opens to one database.

Every PostgreSQL connection a process opens (SQLAlchemy's pool, the hot
path's own, the leases' listener) takes a place first (`connect`) and gives
it back when it is closed (`closed`, or when it is garbage-collected), so
the server never sees more than ``size`` from the process. A caller that
finds no place waits up to ``timeout`` seconds, then gets SQLAlchemy's pool
``TimeoutError``. A place is never given back twice. A forked child starts
with an empty budget (its parent's connections are not its own).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final, TypeVar

import sqlalchemy.exc

C = TypeVar("C")

DEFAULT_TIMEOUT_SECONDS: Final = 30.0


class ConnectionBudget:
    """Places for ``size`` open connections (see the module)."""

    def __init__(self, size: int, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.size = max(1, size)
        self.timeout = timeout
        self._changed = threading.Condition()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._in_use = 0
        self._held: weakref.WeakKeyDictionary[Any, weakref.finalize[Any, Any]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def in_use(self) -> int:
        """How many connections this process has open on the budget."""
        with self._changed:
            return self._in_use if self._pid == os.getpid() else 0

    def connect(self, opener: Callable[[], C]) -> C:
        """``opener()`` once a place is free; the place stays taken until `closed`."""
        with self._changed:
            if self._pid != os.getpid():
                self._reset()
            if not self._changed.wait_for(lambda: self._in_use < self.size, self.timeout):
                raise sqlalchemy.exc.TimeoutError(
                    f"all {self.size} connections of the process's budget stayed busy, "
                    f"timeout {self.timeout:.2f} (METERING_DB_CONNECTIONS)"
                )
            self._in_use += 1
        try:
            connection = opener()
        except BaseException:
            self._give_back(self._pid)
            raise
        with self._changed:
            self._held[connection] = weakref.finalize(connection, self._give_back, self._pid)
        return connection

    def closed(self, connection: object) -> None:
        """``connection`` was closed: its place is free (once)."""
        with self._changed:
            finalizer = self._held.pop(connection, None)
        if finalizer is not None:
            finalizer()

    def _give_back(self, pid: int) -> None:
        with self._changed:
            if pid != self._pid:
                return  # a place of the parent's budget, before a fork
            self._in_use = max(0, self._in_use - 1)
            self._changed.notify()
