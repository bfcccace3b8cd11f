"""The dead letters (``rejected_messages``): input that could not be applied,
kept with its reason: undecodable messages, reused ids, and each rejected
event whole (its reason is its ``rejected`` result's). `rejected_rows`
builds the rows for every path that writes them; `RejectedStore` writes,
lists and counts them, finds the rejected events (`rejected_events`) and
deletes what a replay applied."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from sqlalchemy import delete, func, select

from metering.domain.events import Rejected
from metering.storage.on_connection import OnConnection
from metering.storage.tables import rejected_messages, results

REJECTED_COLUMNS: Final = ("digest", "event_id", "reason", "raw", "received_at_us")


def rejected_rows(
    rows: Sequence[Rejected], now_us: int
) -> list[tuple[str, str | None, str, str, int]]:
    """Dead-letter rows in `REJECTED_COLUMNS` order, for every path that writes them."""
    found = []
    for event_id, reason, raw in rows:
        # The dead-letter record must take anything: a NUL or a lone
        # surrogate is written as an escape (PostgreSQL stores neither).
        reason, raw = _storable(reason), _storable(raw)
        digest = hashlib.sha256(f"{reason}\n{raw}".encode()).hexdigest()
        found.append((digest, event_id, reason, raw, now_us))
    return found


def _storable(text: str) -> str:
    """``text`` with NUL and lone surrogates as backslash escapes."""
    if text.isascii() and "\x00" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


class RejectedStore(OnConnection):
    """Dead letters on one connection; the caller owns the transaction."""

    def record_rejected_messages(self, rows: Sequence[Rejected], now_us: int) -> None:
        """Keep (event id or None, reason, raw JSON) of input that could not be applied."""
        if not rows:
            return
        params = [
            dict(zip(REJECTED_COLUMNS, row, strict=True)) for row in rejected_rows(rows, now_us)
        ]
        statement = self._insert(rejected_messages).on_conflict_do_nothing(
            index_elements=["digest"]
        )
        self.connection.execute(statement, params)

    def list_rejected_messages(self, count: int = 100) -> list[Rejected]:
        """The ``count`` newest, newest first."""
        query = (
            select(rejected_messages)
            .order_by(rejected_messages.c.received_at_us.desc(), rejected_messages.c.id.desc())
            .limit(count)
        )
        return [Rejected(r.event_id, r.reason, r.raw) for r in self.connection.execute(query)]

    def count_rejected_since(self, since_us: int) -> int:
        """Dead letters kept at or after ``since_us``."""
        table = rejected_messages
        query = select(func.count()).where(table.c.received_at_us >= since_us)
        return int(self.connection.execute(query).scalar_one())

    def rejected_events(self, count: int) -> list[tuple[str, str, str]]:
        """(digest, event id, raw event) of the ``count`` oldest dead letters
        of events whose result is still ``rejected`` for the letter's reason."""
        table = rejected_messages
        query = (
            select(table.c.digest, table.c.event_id, table.c.raw)
            .join(
                results,
                (results.c.event_id == table.c.event_id) & (results.c.reason == table.c.reason),
            )
            .where(results.c.outcome == "rejected")
            .order_by(table.c.received_at_us, table.c.id)
            .limit(count)
        )
        return [(r.digest, r.event_id, r.raw) for r in self.connection.execute(query)]

    def take_rejected_results(self, event_ids: Sequence[str]) -> set[str]:
        """Delete the ``rejected`` results of these events; the ids it deleted
        (one taken by a concurrent transaction is not among them)."""
        if not event_ids:
            return set()
        statement = (
            delete(results)
            .where(results.c.event_id.in_(list(event_ids)), results.c.outcome == "rejected")
            .returning(results.c.event_id)
        )
        return set(self.connection.execute(statement).scalars())

    def delete_rejected_messages(self, digests: Sequence[str]) -> None:
        if digests:
            table = rejected_messages
            self.connection.execute(delete(table).where(table.c.digest.in_(list(digests))))
