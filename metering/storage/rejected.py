"""The dead letters (``rejected_messages``): input that could not be applied,
kept with its reason. `rejected_rows` builds the rows for every path that
writes them; `RejectedStore` writes and lists them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from sqlalchemy import select

from metering.domain.events import Rejected
from metering.storage.on_connection import OnConnection
from metering.storage.tables import rejected_messages

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
