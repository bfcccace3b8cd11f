"""Seats in SQL: the live events per value of a distinct limit's windows, one
while it has any (``distinct_values``; the rules are in `metering.domain.distinct`).

Lock order: a window's ``distinct_values`` rows are read and written only
after its counter's row is locked (by `Store.lock_counters`), in the same
transaction, so the counter's lock serialises every writer of them: eight
processes adding the same new value one after another see each other's
row, and one of them takes the seat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from sqlalchemy import and_, delete, exists, select, tuple_

from metering.domain.distinct import SeatKey, Seen
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.tables import counters, distinct_values

_D: Final = distinct_values.c


class DistinctStore(OnConnection):
    """``distinct_values`` rows on one connection; the caller owns the transaction."""

    def live(self, keys: Iterable[SeatKey]) -> Seen:
        """The live events (`metering.domain.distinct.HELD` or 0) of each
        (limit, subject, window start, value) that has a row."""
        wanted = sorted({(subject, name, start, value) for name, subject, start, value in keys})
        found: Seen = {}
        for part in chunks(wanted):
            query = select(_D.limit_name, _D.subject, _D.window_start_us, _D.value, _D.live_events)
            query = query.where(
                tuple_(_D.subject, _D.limit_name, _D.window_start_us, _D.value).in_(part)
            )
            for name, subject, start, value, live in self.connection.execute(query):
                found[(name, subject, int(start), value)] = int(live)
        return found

    def add(self, changes: Mapping[SeatKey, int]) -> None:
        """Add each change to its value's live events: a positive one inserts
        the value's first row; a negative one (a void) only updates a row."""
        ordered = sorted(changes.items(), key=lambda item: (item[0][1], *item[0]))
        rows: list[dict[str, Any]] = [
            {"subject": s, "limit_name": n, "window_start_us": w, "value": v, "live_events": d}
            for (n, s, w, v), d in ordered
            if d
        ]
        key = ["subject", "limit_name", "window_start_us", "value"]
        self._add_amounts(distinct_values, key, "live_events", rows)

    def forget_cleared(self, subject: str | None, limit: str | None) -> None:
        """After a reset: the values of windows whose counter it deleted."""
        c = counters.c
        which = [
            ~exists().where(
                and_(
                    c.subject == _D.subject,
                    c.limit_name == _D.limit_name,
                    c.window_start_us == _D.window_start_us,
                )
            )
        ]
        if subject is not None:
            which.append(_D.subject == subject)
        if limit is not None:
            which.append(_D.limit_name == limit)
        self.connection.execute(delete(distinct_values).where(*which))

    def seats(self, subject: str, limit: str, at_us: int) -> list[str]:
        """The values holding a seat in the subject's window at ``at_us``, in order."""
        c = counters.c
        query = (
            select(_D.value)
            .join(
                counters,
                and_(
                    c.subject == _D.subject,
                    c.limit_name == _D.limit_name,
                    c.window_start_us == _D.window_start_us,
                ),
            )
            .where(
                _D.subject == subject,
                _D.limit_name == limit,
                _D.live_events > 0,
                c.window_start_us <= at_us,
                c.window_end_us > at_us,
            )
            .order_by(_D.value)
        )
        return [str(value) for (value,) in self.connection.execute(query)]
