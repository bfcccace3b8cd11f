"""Round trips to PostgreSQL, counted at the driver (psycopg), whoever sends them.

A pipeline is one round trip; outside a pipeline each statement is one, and
so is a COMMIT or ROLLBACK that ends an open transaction. SQLAlchemy's
statements go through the same psycopg cursors, so the count holds on the
hot path's own connections and on SQLAlchemy's alike.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg.waiting import Ready, Wait


def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch psycopg to count round trips into the returned one-cell list."""
    trips = [0]
    pipeline = psycopg.Connection.pipeline

    def counted_pipeline(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        trips[0] += 1
        return pipeline(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "pipeline", counted_pipeline)

    for name in ("execute", "executemany"):
        original = getattr(psycopg.Cursor, name)

        def counted_statement(
            self: psycopg.Cursor[Any], *args: Any, _original: Any = original, **kwargs: Any
        ) -> Any:
            if self.connection._pipeline is None:
                trips[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, name, counted_statement)

    for name in ("commit", "rollback"):
        ending = getattr(psycopg.Connection, name)

        def counted_end(
            self: psycopg.Connection[Any], *args: Any, _original: Any = ending, **kwargs: Any
        ) -> Any:
            if self._pipeline is None and self.info.transaction_status != TransactionStatus.IDLE:
                trips[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, name, counted_end)
    return trips


def count_network_waits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch psycopg to count, into the returned one-cell list, the times a
    connection waited for the server's reply: its calls of
    `psycopg.Connection.wait` whose operation waited to read, or read what
    had come (sending alone, as a pipeline's statements are, is not counted:
    the server answers them at the sync). A pipeline that fetches results
    before its end, or a COMMIT that syncs inside it, counts each wait:
    these are the network round trips, as strace sees them."""
    waits = [0]
    wait = psycopg.Connection.wait

    def observed(gen: Any) -> Any:
        read = False
        try:
            state = next(gen)
            while True:
                ready = yield state
                if not read and (state == Wait.R or ready & Ready.R):
                    read = True
                    waits[0] += 1
                state = gen.send(ready)
        except StopIteration as stop:
            return stop.value

    def counted_wait(self: psycopg.Connection[Any], gen: Any, *args: Any, **kwargs: Any) -> Any:
        return wait(self, observed(gen), *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "wait", counted_wait)
    return waits
