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
