"""Checkout rows and their per-subject lock rows (`metering.licenses`).

Lock order: a checkout, checkin or renew locks its (subject, limit) row of
``license_pools`` first, then reads or changes that pair's checkouts. The
sweep changes only expired held checkouts, each in one conditional UPDATE
(``state = 'held' AND expires_at_us <= now``) that PostgreSQL re-checks once
it has the row, so it never waits for a pool lock while holding a checkout.
On SQLite ``BEGIN IMMEDIATE`` serialises every writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from sqlalchemy import ColumnElement, delete, or_, select, update

from metering.domain.licenses import CheckoutState, Held, ReleasedBy
from metering.storage.on_connection import OnConnection
from metering.storage.records import RecordColumns
from metering.storage.tables import checkouts, license_pools


@dataclass(frozen=True, slots=True)
class CheckoutRecord:
    id: str
    subject: str
    limit: str
    cost: int
    state: CheckoutState
    created_at_us: int
    ttl_us: int
    expires_at_us: int
    released_at_us: int | None = None
    released_by: ReleasedBy | None = None


_CHECKOUT: Final = RecordColumns(
    CheckoutRecord,
    columns={"limit": "limit_name"},
    read={"state": CheckoutState, "released_by": lambda by: ReleasedBy(by) if by else None},
    write={"state": attrgetter("value"), "released_by": lambda by: by.value if by else None},
)


_HELD = CheckoutState.HELD.value
_RELEASED = CheckoutState.RELEASED.value


class CheckoutStore(OnConnection):
    """Checkout queries on one connection; the caller owns the transaction."""

    def lock_pool(self, subject: str, limit: str, now_us: int) -> int | None:
        """Lock the pair's row (made on first use); when a denial was last announced."""
        self.connection.execute(
            self._insert(license_pools)
            .values(subject=subject, limit_name=limit, denied_at_us=None, updated_at_us=now_us)
            .on_conflict_do_nothing()
        )
        query = select(license_pools.c.denied_at_us).where(
            license_pools.c.subject == subject, license_pools.c.limit_name == limit
        )
        if self._dialect == "postgresql":
            query = query.with_for_update()
        return self.connection.execute(query).scalar_one()  # type: ignore[no-any-return]

    def mark_denied(self, subject: str, limit: str, denied_at_us: int | None, now_us: int) -> None:
        self.connection.execute(
            update(license_pools)
            .where(license_pools.c.subject == subject, license_pools.c.limit_name == limit)
            .values(denied_at_us=denied_at_us, updated_at_us=now_us)
        )

    def held(self, subject: str, limit: str, now_us: int) -> list[Held]:
        """The pair's checkouts that hold units at ``now_us``: (cost, expires_at_us)."""
        query = select(checkouts.c.cost, checkouts.c.expires_at_us).where(
            checkouts.c.subject == subject,
            checkouts.c.limit_name == limit,
            checkouts.c.state == _HELD,
            checkouts.c.expires_at_us > now_us,
        )
        return [(int(cost), int(expires)) for cost, expires in self.connection.execute(query)]

    def insert(self, record: CheckoutRecord) -> None:
        self.connection.execute(checkouts.insert().values(_CHECKOUT.values(record)))

    def get(self, checkout_id: str) -> CheckoutRecord | None:
        row = self.connection.execute(
            select(checkouts).where(checkouts.c.id == checkout_id)
        ).first()
        return _CHECKOUT.of_row(row) if row is not None else None

    def check_in(self, checkout_id: str, now_us: int) -> bool:
        """Release a held, unexpired checkout; False if it was not (nothing changed)."""
        return self._change_held(
            checkout_id,
            now_us,
            state=_RELEASED,
            released_at_us=now_us,
            released_by=ReleasedBy.CHECKIN.value,
        )

    def extend(self, checkout_id: str, expires_at_us: int, ttl_us: int, now_us: int) -> bool:
        """Move a held, unexpired checkout's expiry; False if it was not (nothing changed)."""
        return self._change_held(checkout_id, now_us, expires_at_us=expires_at_us, ttl_us=ttl_us)

    def _change_held(self, checkout_id: str, now_us: int, **values: object) -> bool:
        """Set ``values`` on a checkout if it is held and unexpired at ``now_us``."""
        outcome = self.connection.execute(
            update(checkouts)
            .where(
                checkouts.c.id == checkout_id,
                checkouts.c.state == _HELD,
                checkouts.c.expires_at_us > now_us,
            )
            .values(**values)
        )
        return bool(outcome.rowcount)

    def release_expired(self, now_us: int, checkout_id: str | None = None) -> int:
        """Mark held checkouts past their expiry released (at their expiry): how many.

        They stopped counting at that instant already; this records it.
        """
        statement = (
            update(checkouts)
            .where(checkouts.c.state == _HELD, checkouts.c.expires_at_us <= now_us)
            .values(
                state=_RELEASED,
                released_at_us=checkouts.c.expires_at_us,
                released_by=ReleasedBy.EXPIRY.value,
            )
        )
        if checkout_id is not None:
            statement = statement.where(checkouts.c.id == checkout_id)
        return int(self.connection.execute(statement).rowcount)

    def delete_released_before(self, before_us: int) -> int:
        outcome = self.connection.execute(
            delete(checkouts).where(
                checkouts.c.state == _RELEASED, checkouts.c.released_at_us < before_us
            )
        )
        return int(outcome.rowcount)

    def list(
        self, subject: str | None, limit: str | None, state: str | None, count: int, now_us: int
    ) -> list[CheckoutRecord]:
        """The ``count`` newest checkouts; ``state`` as it stands at ``now_us``."""
        query = select(checkouts).order_by(checkouts.c.created_at_us.desc(), checkouts.c.id)
        if subject is not None:
            query = query.where(checkouts.c.subject == subject)
        if limit is not None:
            query = query.where(checkouts.c.limit_name == limit)
        if state is not None:
            query = query.where(_in_state(state, now_us))
        return [_CHECKOUT.of_row(row) for row in self.connection.execute(query.limit(count))]


def _in_state(state: str, now_us: int) -> ColumnElement[bool]:
    """Held: held and unexpired at ``now_us``; released: released, or expired
    at ``now_us`` whether or not the sweep has marked it yet."""
    expired = checkouts.c.expires_at_us <= now_us
    if state == _HELD:
        return (checkouts.c.state == _HELD) & ~expired
    return or_(checkouts.c.state == _RELEASED, expired)
