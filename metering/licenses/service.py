"""Checkouts of floating licenses, each call one transaction (the rules:
`metering.domain.licenses`; the lock order: `metering.storage.checkouts`).

`checkout` locks the subject's pool row, sums what its unexpired checkouts hold, and records
the new one only if it fits the maximum in force (the subject's entitlement, else the
limit's). A checkout id given again answers the stored checkout while it is held (retries)
and raises `CheckoutReleased` once it has ended; a denial stores only the pool's "denial
announced" mark. `checkin` is one conditional UPDATE from held to released: one caller gets
the checkout back, later ones 0. `renew` moves a held, unexpired checkout's expiry later
(never earlier); an expired one cannot be renewed (its license may be someone else's).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from metering.domain.bounds import validate_count
from metering.domain.events import (
    validate_cost,
    validate_event_id,
    validate_filters,
    validate_subject,
)
from metering.domain.grants import maximum_at
from metering.domain.instants import from_us
from metering.domain.kinds import refuse
from metering.domain.licenses import (
    CheckoutState,
    ReleasedBy,
    denied_document,
    fits,
    held_units,
    retry_at_us,
    validate_ttl,
)
from metering.domain.limits import Limit, validate_limit_name
from metering.errors import (
    CheckoutConflict,
    CheckoutReleased,
    InvalidInput,
    UnknownCheckout,
    UnknownLimit,
)
from metering.storage.allowances import AllowanceStore
from metering.storage.checkouts import CheckoutRecord, CheckoutStore
from metering.storage.database import Database
from metering.storage.limits import LimitStore
from metering.storage.webhooks import WebhookStore, encode_payload


@dataclass(frozen=True, slots=True)
class Checkout:
    """A checkout as decided or as stored.

    ``state`` is ``held``, ``released`` (checked in, or expired) or
    ``denied`` (nothing was stored); it is ``allowed`` only while held.
    ``held`` and ``maximum`` are the subject's units held after the decision
    and its maximum (None when looked up); ``retry_at`` is when a denied
    checkout would fit if nothing were checked in (None: never, its cost is
    above the maximum).
    """

    id: str
    subject: str
    limit: str
    cost: int
    state: str
    created_at: datetime
    expires_at: datetime | None
    held: int | None = None
    maximum: int | None = None
    released_at: datetime | None = None
    released_by: str | None = None
    retry_at: datetime | None = None

    @property
    def allowed(self) -> bool:
        return self.state == CheckoutState.HELD.value

    @classmethod
    def of(
        cls,
        record: CheckoutRecord,
        held: int | None = None,
        maximum: int | None = None,
    ) -> Checkout:
        released = record.released_at_us
        return cls(
            id=record.id,
            subject=record.subject,
            limit=record.limit,
            cost=record.cost,
            state=record.state.value,
            created_at=from_us(record.created_at_us),
            expires_at=from_us(record.expires_at_us),
            held=held,
            maximum=maximum,
            released_at=from_us(released) if released is not None else None,
            released_by=record.released_by.value if record.released_by else None,
        )

    def to_dict(self) -> dict[str, Any]:
        def iso(moment: datetime | None) -> str | None:
            return moment.isoformat().replace("+00:00", "Z") if moment else None

        return {
            "id": self.id,
            "subject": self.subject,
            "limit": self.limit,
            "cost": self.cost,
            "allowed": self.allowed,
            "state": self.state,
            "held": self.held,
            "maximum": self.maximum,
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "released_at": iso(self.released_at),
            "released_by": self.released_by,
            "retry_at": iso(self.retry_at),
        }


def new_checkout_id() -> str:
    return "co_" + secrets.token_hex(12)


def concurrent_limit(connection: Connection, name: str) -> Limit:
    """The limit ``name``, which must be concurrent (`WrongAlgorithm` otherwise)."""
    limit = LimitStore(connection).load_limits([name]).get(name)
    if limit is None:
        raise UnknownLimit(name)
    refuse(limit, "checkout")
    return limit


def checkout(
    database: Database,
    subject: str,
    limit: str,
    cost: int,
    ttl_seconds: float,
    checkout_id: str | None,
) -> Checkout:
    """Hold ``cost`` units of ``limit`` for ``subject`` for ``ttl_seconds``, if they fit."""
    validate_subject(subject)
    validate_limit_name(limit)
    cost = validate_cost(cost)
    ttl_us = validate_ttl(ttl_seconds)
    wanted = new_checkout_id() if checkout_id is None else checkout_id
    validate_event_id(wanted, "checkout_id")
    now_us = database.now_us()
    asked = CheckoutRecord(
        wanted, subject, limit, cost, CheckoutState.HELD, now_us, ttl_us, now_us + ttl_us
    )
    return database.run(lambda connection: _checkout(connection, asked))


def _checkout(connection: Connection, asked: CheckoutRecord) -> Checkout:
    rule = concurrent_limit(connection, asked.limit)
    rows = CheckoutStore(connection)
    now_us, subject, name = asked.created_at_us, asked.subject, asked.limit
    denied_at = rows.lock_pool(subject, name, now_us)
    history = AllowanceStore(connection).histories([(name, subject)]).get((name, subject))
    maximum = maximum_at(history, rule.maximum, now_us)
    held = rows.held(subject, name, now_us)
    used = held_units(held, now_us)
    existing = rows.get(asked.id)
    if existing is not None:
        same = (existing.subject, existing.limit, existing.cost) == (subject, name, asked.cost)
        if not same:
            raise CheckoutConflict(asked.id)
        current = _as_of(existing, now_us)
        if current.state is CheckoutState.RELEASED:
            raise _ended(current)
        return Checkout.of(current, used, maximum)
    if fits(used, asked.cost, maximum):
        rows.insert(asked)
        if denied_at is not None:
            rows.mark_denied(subject, name, None, now_us)
        return Checkout.of(asked, used + asked.cost, maximum)
    retry = retry_at_us(held, asked.cost, maximum, now_us)
    if denied_at is None:  # the first denial since a checkout last fitted
        rows.mark_denied(subject, name, now_us, now_us)
        document = denied_document(subject, name, maximum, used, retry, now_us)
        webhooks = WebhookStore(connection)
        endpoints = webhooks.list_endpoints(enabled_only=True)
        webhooks.add_message("limit.denied", encode_payload(document), endpoints, now_us)
    denied = Checkout.of(asked, used, maximum)
    return _replace_denied(denied, retry)


def _replace_denied(checkout: Checkout, retry: int | None) -> Checkout:
    return Checkout(
        id=checkout.id,
        subject=checkout.subject,
        limit=checkout.limit,
        cost=checkout.cost,
        state="denied",
        created_at=checkout.created_at,
        expires_at=None,
        held=checkout.held,
        maximum=checkout.maximum,
        retry_at=from_us(retry) if retry is not None else None,
    )


def _existing(rows: CheckoutStore, checkout_id: str) -> CheckoutRecord:
    """The checkout ``checkout_id``; `UnknownCheckout` when there is none."""
    record = rows.get(checkout_id)
    if record is None:
        raise UnknownCheckout(checkout_id)
    return record


def checkin(database: Database, checkout_id: str) -> int:
    """Give a checkout back: its cost the first time, 0 after (or once it expired)."""
    validate_event_id(checkout_id, "checkout_id")
    now_us = database.now_us()

    def work(connection: Connection) -> int:
        rows = CheckoutStore(connection)
        record = _existing(rows, checkout_id)
        if rows.check_in(checkout_id, now_us):
            return record.cost
        rows.release_expired(now_us, checkout_id)  # it came back at its expiry: say so
        return 0

    return database.run(work)


def renew(database: Database, checkout_id: str, ttl_seconds: float | None) -> Checkout:
    """Hold a checkout until ``ttl_seconds`` from now (default: its last time to live).

    Never shortens it; `CheckoutReleased` if it was checked in or has expired.
    """
    validate_event_id(checkout_id, "checkout_id")
    ttl_us = validate_ttl(ttl_seconds) if ttl_seconds is not None else None
    now_us = database.now_us()

    def work(connection: Connection) -> Checkout:
        rows = CheckoutStore(connection)
        record = _existing(rows, checkout_id)
        ttl = record.ttl_us if ttl_us is None else ttl_us
        expires_at = max(record.expires_at_us, now_us + ttl)
        if not rows.extend(checkout_id, expires_at, ttl, now_us):
            raise _ended(_as_of(_existing(rows, checkout_id), now_us))
        found = rows.get(checkout_id)
        assert found is not None
        return Checkout.of(found)

    return database.run(work)


def checkout_info(database: Database, checkout_id: str) -> Checkout | None:
    """A stored checkout as it stands now (an expired one shows as released)."""
    validate_event_id(checkout_id, "checkout_id")
    now_us = database.now_us()
    record = database.run(lambda c: CheckoutStore(c).get(checkout_id))
    return None if record is None else Checkout.of(_as_of(record, now_us))


def checkouts(
    database: Database, subject: str | None, limit: str | None, state: str | None, count: int
) -> list[Checkout]:
    """The ``count`` newest checkouts, optionally of one subject, limit and state
    (as it stands now: an expired checkout is released, swept or not)."""
    validate_filters(subject, limit)
    if state is not None and state not in ("held", "released"):
        raise InvalidInput("state", "must be held or released")
    validate_count("count", count)
    now_us = database.now_us()
    records = database.run(lambda c: CheckoutStore(c).list(subject, limit, state, count, now_us))
    return [Checkout.of(_as_of(r, now_us)) for r in records]


def _ended(record: CheckoutRecord) -> CheckoutReleased:
    """The refusal of a renew or a repeated checkout of a released checkout."""
    by = record.released_by or ReleasedBy.EXPIRY
    at = record.released_at_us if record.released_at_us is not None else record.expires_at_us
    return CheckoutReleased(record.id, by.value, from_us(at))


def _as_of(record: CheckoutRecord, now_us: int) -> CheckoutRecord:
    """An expired held checkout is released (at its expiry), swept or not yet."""
    if record.state is CheckoutState.HELD and record.expires_at_us <= now_us:
        return CheckoutRecord(
            record.id,
            record.subject,
            record.limit,
            record.cost,
            CheckoutState.RELEASED,
            record.created_at_us,
            record.ttl_us,
            record.expires_at_us,
            record.expires_at_us,
            ReleasedBy.EXPIRY,
        )
    return record
