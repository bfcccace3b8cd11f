"""`LimitNames`: which limits a database defines, for a client that checks
its charges before it queues them (`metering.pipeline.producer.UsageProducer`).

`unknown` answers from the names it read last; a name missing from them
reads them again, once, so a limit defined a moment ago in another process
is known. It answers None when it cannot see the limits (a SQLite file that
does not exist, a database with no schema, or one that did not answer within
`CONNECT_TIMEOUT_SECONDS`, then not asked again for `RETRY_AFTER_SECONDS`):
the caller queues unchecked and the workers decide. Reads are read-only and
create nothing; SQLAlchemy is imported on the first, never with this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from metering.errors import MeteringError

if TYPE_CHECKING:
    from metering.storage.health import DatabaseProbe

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS: Final = 2.0
RETRY_AFTER_SECONDS: Final = 30.0


class LimitNames:
    """The limit names of the database at ``url``, read when first asked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._names: frozenset[str] | None = None
        self._probe: DatabaseProbe | None = None
        self._quiet_until = 0.0  # monotonic: a database that failed is not asked before
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
        if time.monotonic() < self._quiet_until:
            return None
        from metering.storage.health import DatabaseProbe

        try:
            if self._probe is None or self._probe.engine is None:  # a file made since
                self.close_probe()
                self._probe = DatabaseProbe(
                    self.url, connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS
                )
            return self._probe.limit_names()
        except MeteringError as exc:
            self._quiet_until = time.monotonic() + RETRY_AFTER_SECONDS
            log.warning("the limits could not be read (%s): events are queued unchecked", exc)
            return None

    def close_probe(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def close(self) -> None:
        with self._lock:
            self.close_probe()
