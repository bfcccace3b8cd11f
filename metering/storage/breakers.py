"""The breakers table (`metering.domain.breaker`): each subject's rates and
quarantine on a limit with a breaker. `BreakerStore` reads the rows of the
pairs a batch charges (locked on PostgreSQL), writes what the batch changed,
lists the quarantined and releases one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, tuple_

from metering.domain.breaker import Breaker, breaker_of, released
from metering.domain.instants import from_us
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.tables import breakers

Pair = tuple[str, str]  # (limit, subject)


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A quarantined subject on a limit, since ``quarantined_at_us``."""

    limit: str
    subject: str
    quarantined_at_us: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "subject": self.subject,
            "quarantined_at": from_us(self.quarantined_at_us).isoformat(),
        }


class BreakerStore(OnConnection):
    """Breaker rows on one connection; the caller owns the transaction."""

    def read(self, pairs: Iterable[Pair], *, lock: bool) -> dict[Pair, Breaker]:
        """The breakers of ``pairs`` that have one (locked with ``lock`` on PostgreSQL)."""
        wanted = sorted(set(pairs))
        found: dict[Pair, Breaker] = {}
        for part in chunks(wanted):
            query = select(breakers).where(
                tuple_(breakers.c.limit_name, breakers.c.subject).in_(list(part))
            )
            if lock and self._postgres:
                query = query.with_for_update()
            for row in self.connection.execute(query):
                found[(row.limit_name, row.subject)] = breaker_of(row[2:8])
        return found

    def write(self, changed: Mapping[Pair, Breaker]) -> None:
        """Insert or replace the rows of ``changed``, in one statement."""
        if not changed:
            return
        rows = [
            {
                "limit_name": limit,
                "subject": subject,
                "short_rate": breaker.short_rate,
                "long_rate": breaker.long_rate,
                "rate_at_us": breaker.rate_at_us,
                "since_us": breaker.since_us,
                "over_since_us": breaker.over_since_us,
                "quarantined_at_us": breaker.quarantined_at_us,
            }
            for (limit, subject), breaker in sorted(changed.items())
        ]
        statement = self._insert(breakers)
        kept = ("subject", "limit_name")
        self.connection.execute(
            statement.on_conflict_do_update(
                index_elements=list(kept),
                set_={c: statement.excluded[c] for c in rows[0] if c not in kept},
            ),
            rows,
        )

    def quarantined(self) -> list[Quarantine]:
        """Every quarantined subject, by limit then subject."""
        query = (
            select(breakers.c.limit_name, breakers.c.subject, breakers.c.quarantined_at_us)
            .where(breakers.c.quarantined_at_us.is_not(None))
            .order_by(breakers.c.limit_name, breakers.c.subject)
        )
        return [Quarantine(*row) for row in self.connection.execute(query)]

    def release(self, pair: Pair, now_us: int, at_us: int | None = None) -> Quarantine | None:
        """End ``pair``'s quarantine (only the one since ``at_us`` when given),
        starting its history again; None when it is not so quarantined."""
        found = self.read([pair], lock=True).get(pair)
        if found is None or found.quarantined_at_us is None:
            return None
        if at_us is not None and found.quarantined_at_us != at_us:
            return None
        self.write({pair: released(found, now_us)})
        return Quarantine(pair[0], pair[1], found.quarantined_at_us)
