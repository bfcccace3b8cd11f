"""Reservation rows: insert, lock, settle, sweep, list.

Lock order: a cancel locks its reservation row, then its counters (through
`Store.lock_counters`); an operator's reset locks held reservations, then
windows and counters; `consume` and `reserve` lock windows and counters and
only insert reservations, so the orders never form a cycle. One exception:
a reservation held while a reset waited for its counter is locked by the
reset last, under the reset's lock timeout (a wait on it is broken and the
reset runs again).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)

from metering.domain.corrections import CounterOf, GivenBack
from metering.domain.reservations import HeldCharge, ReservationState
from metering.storage.records import RecordColumns
from metering.storage.tables import overdrafts, reservations, results


@dataclass(frozen=True, slots=True)
class ReservationRecord:
    id: str
    state: ReservationState
    charges: tuple[HeldCharge, ...]
    created_at_us: int
    expires_at_us: int
    settled_at_us: int | None
    settled_by: str | None
    given_back: tuple[GivenBack, ...] = ()
    # Whether a reset dropped some of its charges from the hold
    # (`ReservationStore.forget_held_charges`): their units are the result's.
    hold_cleared: bool = False


def _given_back(text: str | None) -> tuple[GivenBack, ...]:
    return tuple(
        (str(subject), str(limit), int(start), int(units))
        for subject, limit, start, units in json.loads(text or "[]")
    )


_RESERVATION: Final = RecordColumns(
    ReservationRecord,
    read={
        "state": ReservationState,
        "charges": lambda text: tuple(HeldCharge.from_row(c) for c in json.loads(text)),
        "given_back": _given_back,
        "hold_cleared": bool,
    },
)


class ReservationStore:
    """Reservation queries on one connection; the caller owns the transaction."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def insert(
        self, reservation_id: str, charges: Sequence[HeldCharge], now_us: int, expires_at_us: int
    ) -> None:
        self.connection.execute(
            insert(reservations).values(
                id=reservation_id,
                state=ReservationState.HELD.value,
                charges=_charges_text(charges),
                created_at_us=now_us,
                expires_at_us=expires_at_us,
            )
        )

    def get(self, reservation_id: str, *, lock: bool = False) -> ReservationRecord | None:
        query = select(reservations).where(reservations.c.id == reservation_id)
        if lock:  # PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers
            query = query.with_for_update()
        row = self.connection.execute(query).first()
        return _RESERVATION.of_row(row) if row is not None else None

    def settle(
        self,
        reservation_id: str,
        state: ReservationState,
        now_us: int,
        by: str,
        given_back: Sequence[GivenBack] = (),
    ) -> None:
        """Settle a reservation; ``given_back``: per counter, the units of its
        charge that went back (a cancel: all of them; a commit of less)."""
        value, at_us, by, returned, _ = settle_row(reservation_id, state, now_us, by, given_back)
        self.connection.execute(
            update(reservations)
            .where(reservations.c.id == reservation_id)
            .values(state=value, settled_at_us=at_us, settled_by=by, given_back=returned)
        )

    def add_overdrafts(
        self, event_id: str, units: Sequence[tuple[str, str, int, int]], now_us: int
    ) -> None:
        """Record a commit's overdraft: per (subject, limit, window start), the
        units a hard limit had no room for. Once per event and counter (the
        reservation row, locked, says whether its excess was charged)."""
        rows = [
            {
                "event_id": event_id,
                "subject": subject,
                "limit_name": limit,
                "window_start_us": start,
                "units": n,
                "created_at_us": now_us,
            }
            for subject, limit, start, n in units
            if n > 0
        ]
        if rows:
            self.connection.execute(insert(overdrafts), rows)

    def lock_held(self, subject: str | None) -> None:
        """Lock the held reservations with a charge on ``subject`` (every
        one, for None), in id order: a reset locks them before any counter."""
        if self.connection.dialect.name == "postgresql":
            self.connection.execute(self._held(subject).with_for_update()).all()

    def forget_held_charges(self, subject: str | None, cleared: Collection[CounterOf]) -> int:
        """Drop from held reservations their charges on the counters a reset
        ``cleared`` (subject, limit, window start), and mark them
        (``hold_cleared``).

        A reset wipes held units along with the rest of the usage; a cancel
        afterwards must not hand them to the counter that started over. The
        reset has run `lock_held` first; one held since (by a reserve that
        the reset's counter lock waited for) is locked here. Returns how
        many reservations changed.
        """
        query = self._held(subject)
        if self.connection.dialect.name == "postgresql":
            query = query.with_for_update()
        changed = 0
        for reservation_id, text in self.connection.execute(query).all():
            charges = [HeldCharge.from_row(c) for c in json.loads(text)]
            kept = [c for c in charges if (c.subject, c.limit, c.window_start_us) not in cleared]
            if len(kept) == len(charges):
                continue
            self.connection.execute(
                update(reservations)
                .where(reservations.c.id == reservation_id)
                .values(charges=_charges_text(kept), hold_cleared=True)
            )
            changed += 1
        return changed

    def forget_overdrafts(
        self, subject: str | None, limit: str | None, cleared: Collection[CounterOf]
    ) -> None:
        """Delete the overdraft of the counters a reset of ``subject`` and
        ``limit`` (None: every one) ``cleared`` (subject, limit, window start):
        it was their usage, gone with it, so the overage report's
        ``overdraft`` counts what the counter holds now. Overdrafts are rare:
        those of the reset's scope are read, the cleared ones deleted."""
        o = overdrafts.c
        query = select(o.subject, o.limit_name, o.window_start_us).distinct()
        if subject is not None:
            query = query.where(o.subject == subject)
        if limit is not None:
            query = query.where(o.limit_name == limit)
        found = {(str(s), str(n), int(w)) for s, n, w in self.connection.execute(query)}
        for who, name, start in sorted(found & set(cleared)):
            self.connection.execute(
                delete(overdrafts).where(
                    o.subject == who, o.limit_name == name, o.window_start_us == start
                )
            )

    def holds_on(self, limit: str) -> bool:
        """Whether a held reservation has a charge on ``limit`` (a JSON text's
        ``[subject, limit, ...]``: a LIKE finds the candidates, each read whole)."""
        needle = json.dumps(limit)[1:-1].replace("\\", "\\\\")
        needle = needle.replace("%", "\\%").replace("_", "\\_")
        query = select(reservations.c.charges).where(
            reservations.c.state == ReservationState.HELD.value,
            reservations.c.charges.like(f'%","{needle}",%', escape="\\"),
        )
        return any(
            HeldCharge.from_row(charge).limit == limit
            for (text,) in self.connection.execute(query)
            for charge in json.loads(text)
        )

    def _held(self, subject: str | None) -> Select[str, str]:
        query = (
            select(reservations.c.id, reservations.c.charges)
            .where(reservations.c.state == ReservationState.HELD.value)
            .order_by(reservations.c.id)
        )
        return query if subject is None else query.where(_mentions(subject))

    def commit_expired(self, now_us: int) -> int:
        """Commit every held reservation whose time to live has passed.

        One statement: on PostgreSQL a concurrent cancel holds the row lock,
        and this UPDATE re-checks ``state = 'held'`` once it gets the row.
        """
        result = self.connection.execute(
            update(reservations)
            .where(
                reservations.c.state == ReservationState.HELD.value,
                reservations.c.expires_at_us <= now_us,
            )
            .values(
                state=ReservationState.COMMITTED.value, settled_at_us=now_us, settled_by="sweeper"
            )
        )
        return int(result.rowcount)

    def delete_settled_before(self, before_us: int) -> int:
        """Delete reservations settled before ``before_us``. One whose cost a
        cancel gave back stays as long as its event's result: a void, which
        needs the result, must still see what the cancel returned."""
        result_left = exists().where(results.c.event_id == reservations.c.id)
        result = self.connection.execute(
            delete(reservations).where(
                reservations.c.state != ReservationState.HELD.value,
                reservations.c.settled_at_us < before_us,
                or_(reservations.c.given_back.is_(None), ~result_left),
            )
        )
        return int(result.rowcount)

    def list(
        self, state: str | None = None, subject: str | None = None, count: int = 100
    ) -> list[ReservationRecord]:
        query = select(reservations).order_by(reservations.c.created_at_us.desc()).limit(count)
        if state is not None:
            query = query.where(reservations.c.state == state)
        if subject is not None:
            query = query.where(_mentions(subject))
        return [_RESERVATION.of_row(row) for row in self.connection.execute(query)]

    def count_by_state(self) -> dict[str, int]:
        query = select(reservations.c.state, func.count()).group_by(reservations.c.state)
        return {state: int(n) for state, n in self.connection.execute(query)}


# A held reservation's row as the hot path's stores insert it (`Changes.holds`):
# id, charges (`charges_text`), created and expiry instants.
HoldRow = tuple[str, str, int, int]

INSERT_HELD: Final = (
    "INSERT INTO reservations (id, state, charges, created_at_us, expires_at_us) "
    "VALUES ({0}, 'held', {0}, {0}, {0})"
)
"""The insert of a `HoldRow`, with the driver's placeholder (``%s`` or ``?``)."""


def hold_row(
    reservation_id: str, charges: Sequence[HeldCharge], now_us: int, expires_at_us: int
) -> HoldRow:
    """The row `ReservationStore.insert` writes, for the hot path's stores."""
    return (reservation_id, _charges_text(charges), now_us, expires_at_us)


# A settled reservation's row as the hot path's stores write it
# (`Changes.settled`): state, settled instant, by, given back, id.
SettleRow = tuple[str, int, str, str | None, str]

SETTLE: Final = (
    "UPDATE reservations SET state = {0}, settled_at_us = {0}, settled_by = {0}, given_back = {0} "
    "WHERE id = {0}"
)
"""The update of a `SettleRow`, with the driver's placeholder (``%s`` or ``?``)."""

SELECT_RESERVATION: Final = (
    f"SELECT {', '.join(_RESERVATION.columns)} FROM reservations WHERE id = {{0}}"
)
"""One reservation's row for `record_of_row` (its columns in the record's
fields' order); on PostgreSQL with ``FOR UPDATE`` appended (SQLite's
``BEGIN IMMEDIATE`` already holds the lock)."""


def settle_row(
    reservation_id: str,
    state: ReservationState,
    now_us: int,
    by: str,
    given_back: Sequence[GivenBack] = (),
) -> SettleRow:
    """The update `ReservationStore.settle` makes, for the hot path's stores."""
    returned = json.dumps([list(key) for key in given_back], separators=(",", ":"))
    return (state.value, now_us, by, returned if given_back else None, reservation_id)


def record_of_row(row: Sequence[Any]) -> ReservationRecord:
    """A `ReservationRecord` from a driver's row of `SELECT_RESERVATION`."""
    return _RESERVATION.of_values(row)


def _charges_text(charges: Sequence[HeldCharge]) -> str:
    return json.dumps([c.to_row() for c in charges], separators=(",", ":"))


def _mentions(subject: str) -> ColumnElement[bool]:
    """Reservations with a charge on ``subject``.

    ``charges`` is JSON text and the subject is each charge's first string:
    a LIKE on the quoted value keeps this portable (operator actions only).
    """
    needle = json.dumps(subject)[1:-1].replace("\\", "\\\\")
    needle = needle.replace("%", "\\%").replace("_", "\\_")
    return reservations.c.charges.like(f'%["{needle}",%', escape="\\")
