"""`LimitNames`: which limits a database defines, for a client that checks
its charges before it queues them (`metering.producer.UsageProducer`).

`unknown` answers from the names it read last; a name missing from them
reads them again, once, so a limit defined a moment ago in another process
is known. It answers None when it cannot see the limits (a SQLite file that
does not exist, a database that does not answer or has no schema): the
caller then queues unchecked and the workers decide. SQLAlchemy is imported
on the first read, never when this module is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from metering.errors import MeteringError

if TYPE_CHECKING:
    from metering.storage.database import Database

log = logging.getLogger(__name__)


class LimitNames:
    """The limit names of the database at ``url``, read when first asked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._names: frozenset[str] | None = None
        self._database: Database | None = None
        self._lock = threading.Lock()

    def unknown(self, names: Iterable[str]) -> list[str] | None:
        """The names among ``names`` no limit has, in order; None when the
        limits cannot be read."""
        wanted = list(dict.fromkeys(names))
        with self._lock:
            known = self._names
            if known is None or any(name not in known for name in wanted):
                known = self._names = self._read()
        if known is None:
            return None
        return [name for name in wanted if name not in known]

    def _read(self) -> frozenset[str] | None:
        from metering.storage.health import sqlite_file

        file = sqlite_file(self.url)
        if file is not None and not file.exists():
            return None  # connecting would make an empty one
        from metering.storage.database import Database
        from metering.storage.limits import LimitStore

        try:
            if self._database is None:
                self._database = Database.connect(self.url)
            return self._database.run(lambda c: LimitStore(c).limit_names())
        except MeteringError as exc:
            log.warning("the limits could not be read (%s): events are queued unchecked", exc)
            return None

    def close(self) -> None:
        with self._lock:
            if self._database is not None:
                self._database.dispose()
                self._database = None
