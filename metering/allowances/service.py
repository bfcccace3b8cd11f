"""The transactions of entitlements, grants and corrections (`Meter` wraps them).

The rules are in `metering.domain.grants` and `metering.domain.corrections`;
the SQL in `metering.storage.allowances`. A void locks in the engines' order
(counters, then grants) and writes the counters, the draws, the correction
and its ``usage.corrected`` notification in one transaction, so a void
racing new usage on the same counter is exact, and a second void of the
same event finds the first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from sqlalchemy import Connection

from metering.allowances.give_back import Returning, give_back
from metering.domain.corrections import (
    DEFAULT_HORIZON_SECONDS,
    VoidedCharge,
    not_reset,
    still_charged,
    validate_reason,
    voided_charges,
)
from metering.domain.events import validate_event_id, validate_filters, validate_subject
from metering.domain.grants import (
    DEFAULT_PRIORITY,
    MAX_GRANT,
    Entitlement,
    validate_amount,
    validate_grant_id,
    validate_priority,
)
from metering.domain.instants import from_us, to_us
from metering.domain.jsonable import fields_dict
from metering.domain.kinds import refuse
from metering.domain.limits import (
    MAX_MAXIMUM,
    Limit,
    is_reserved,
    parse_period,
    validate_limit_name,
)
from metering.domain.notifications import _iso
from metering.domain.recurring import Issue, low_threshold, next_due_us, parse_low, period_end
from metering.domain.reservations import ReservationState
from metering.engine.seats import free_seats
from metering.errors import (
    CorrectionConflict,
    CorrectionRefused,
    GrantConflict,
    InvalidInput,
    ReservedLimit,
    UnknownEvent,
    UnknownLimit,
)
from metering.limits.files import load_entitlements_file
from metering.storage.allowances import AllowanceStore, CorrectionRecord, GrantRecord
from metering.storage.connections import RetryTransaction
from metering.storage.database import Database
from metering.storage.limits import BUMP_LIMITS_VERSION
from metering.storage.quota_notices import notify
from metering.storage.recurring import ScheduleRecord, ScheduleStore, insert_issue, issue_due
from metering.storage.reservations import ReservationStore
from metering.storage.results import ResultRecord
from metering.storage.store import Store
from metering.storage.webhook_records import encode_payload
from metering.storage.webhooks import WebhookStore


def _limit(connection: Connection, name: str) -> Limit:
    found = Store(connection).load_limits([name]).get(name)
    if found is None:
        raise UnknownLimit(name)
    return found


def _users_limit(name: str, action: str) -> str:
    """``name`` checked, and not one of the product's own (`ReservedLimit`)."""
    validate_limit_name(name)
    if is_reserved(name):
        raise ReservedLimit(name, action)
    return name


def _moment(field_name: str, value: datetime | None, default_us: int) -> int:
    return default_us if value is None else to_us(value, field_name=field_name)


# -- entitlements -----------------------------------------------------------------


def set_entitlement(
    database: Database,
    subject: str,
    limit: str,
    maximum: int | None,
    effective_from: datetime | None = None,
) -> Entitlement:
    """Give ``subject`` its own maximum for ``limit`` from ``effective_from``
    (default: now) on; None returns it to the limit's default from then on."""
    return set_entitlements(database, [(subject, limit, maximum, effective_from)])[0]


def _entitlement(
    subject: str, limit: str, maximum: int | None, effective_from: datetime | None, now_us: int
) -> Entitlement:
    validate_subject(subject)
    _users_limit(limit, "give a subject its own maximum of")
    if maximum is not None:
        validate_amount("maximum", maximum, MAX_MAXIMUM)
    start_us = _moment("effective_from", effective_from, now_us)
    return Entitlement(subject, limit, maximum, start_us, now_us)


def set_entitlements(
    database: Database,
    changes: Sequence[tuple[str, str, int | None, datetime | None]],
) -> list[Entitlement]:
    """`set_entitlement` of each (subject, limit, maximum, effective_from), in one
    transaction: all are stored, or none (a file of them loads whole)."""
    now_us = database.now_us()
    made = [_entitlement(*change, now_us) for change in changes]

    def work(connection: Connection) -> list[Entitlement]:
        for name in dict.fromkeys(change.limit for change in made):
            _limit(connection, name)
        store = AllowanceStore(connection)
        for change in made:
            store.set_entitlement(change)
            notify(connection, change.subject, change.limit)  # every process's leases
        return made

    return database.run(work)


def load_entitlements(database: Database, path: str | Path) -> list[Entitlement]:
    """Validate a YAML or TOML file of per-subject maximums
    (`metering.limits.files.load_entitlements_file`) and store them all, or none:
    an error names the entry and its field."""
    entries = load_entitlements_file(path)
    changes = [(e.subject, e.limit, e.maximum, e.effective_from) for e in entries]
    try:
        return set_entitlements(database, changes)
    except UnknownLimit as exc:
        where = next((e.where for e in entries if e.limit == exc.limit), "an entry")
        raise InvalidInput("entitlements file", f"{path}: {where}: limit: {exc}") from exc


def entitlements(
    database: Database, subject: str | None = None, limit: str | None = None
) -> list[Entitlement]:
    validate_filters(subject, limit)
    return database.run(lambda c: AllowanceStore(c).entitlements(subject, limit))


# -- grants -------------------------------------------------------------------


# `Grant.to_dict`'s keys, in order.
GRANT_KEYS: Final = (
    "grant_id",
    "subject",
    "limit",
    "amount",
    "used",
    "left",
    "effective_from",
    "expires_at",
    "reason",
    "priority",
    "recurring_grant_id",
    "issue",
    "low_at",
)


@dataclass(frozen=True, slots=True)
class Grant:
    """A top-up as callers see it. ``duplicate``: this grant id existed already."""

    grant_id: str
    subject: str
    limit: str
    amount: int
    used: int
    effective_from: datetime
    expires_at: datetime | None
    reason: str | None
    duplicate: bool = False
    priority: int = DEFAULT_PRIORITY
    # An issue of a recurring grant: the recurring grant's id (the first
    # issue's), and its number; ``low_at``: left at which ``grant.low`` is sent.
    recurring_grant_id: str | None = None
    issue: int | None = None
    low_at: int | None = None

    @property
    def left(self) -> int:
        return self.amount - self.used

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, GRANT_KEYS)


def _grant_of(record: GrantRecord, *, duplicate: bool = False) -> Grant:
    expires = record.expires_at_us
    return Grant(
        record.grant_id,
        record.subject,
        record.limit,
        record.amount,
        record.used,
        from_us(record.effective_from_us),
        from_us(expires) if expires is not None else None,
        record.reason,
        duplicate,
        record.priority,
        record.schedule_id,
        record.issue_number,
        record.low_at,
    )


def add_grant(
    database: Database,
    subject: str,
    limit: str,
    amount: int,
    *,
    expires_at: datetime | None = None,
    grant_id: str | None = None,
    effective_from: datetime | None = None,
    reason: str | None = None,
    priority: int = DEFAULT_PRIORITY,
    low: int | str | None = None,
    every: str | None = None,
    rollover_max: int | None = None,
    until: datetime | None = None,
) -> Grant:
    """Add ``amount`` on top of ``subject``'s maximum for ``limit`` (a fixed window).

    Grants are drawn by ``priority`` (the lowest first), then the earliest
    expiring first. ``low`` (units, or a percentage such as ``"20%"``):
    when what is left falls to it, ``grant.low`` is announced, once.
    ``every`` (a period, ``"1mo"``) makes it recurring
    (`metering.domain.recurring`): one issue now, one per period after,
    until ``until``, each with up to ``rollover_max`` of the last one's
    unused amount; the first issue is returned.

    Idempotent by ``grant_id``: the same grant again returns the stored one
    (``duplicate``); the same id with other values raises `GrantConflict`.
    """
    validate_subject(subject)
    _users_limit(limit, "grant")
    validate_amount("amount", amount, MAX_GRANT)
    validate_priority(priority)
    low_units, low_percent = parse_low(low) if low is not None else (None, None)
    grant_id = validate_grant_id(grant_id) if grant_id is not None else uuid.uuid4().hex
    if reason is not None:
        validate_reason(reason)
    now_us = database.now_us()
    if every is not None:
        return add_recurring(
            database,
            subject,
            limit,
            amount,
            every=every,
            rollover_max=rollover_max,
            until=until,
            grant_id=grant_id,
            reason=reason,
            priority=priority,
            low=(low_units, low_percent),
            unsupported={"expires_at": expires_at, "effective_from": effective_from},
            now_us=now_us,
        )
    if rollover_max is not None:
        raise InvalidInput("rollover_max", "only a recurring grant (with every) rolls over")
    if until is not None:
        raise InvalidInput(
            "until", "only a recurring grant (with every) has an end; use expires_at"
        )
    start_us = _moment("effective_from", effective_from, now_us)
    expires_us = None if expires_at is None else to_us(expires_at, field_name="expires_at")
    if expires_us is not None and expires_us <= start_us:
        raise InvalidInput("expires_at", "must be after the grant takes effect")
    record = GrantRecord(
        grant_id,
        subject,
        limit,
        amount,
        0,
        start_us,
        expires_us,
        reason,
        now_us,
        priority,
        low_at=low_threshold(amount, low_units, low_percent),
    )

    def work(connection: Connection) -> Grant:
        _fixed_window(connection, limit)
        store = AllowanceStore(connection)
        if store.add_grant(record) is not None:
            return _grant_of(record)
        existing = store.grant(grant_id)
        assert existing is not None
        same = (existing.subject, existing.limit, existing.amount, existing.expires_at_us)
        if (
            same != (subject, limit, amount, expires_us)
            or (effective_from is not None and existing.effective_from_us != start_us)
            or existing.schedule_id is not None
            or (existing.priority, existing.low_at) != (record.priority, record.low_at)
        ):
            raise GrantConflict(grant_id)
        return _grant_of(existing, duplicate=True)

    return database.run(work)


def _fixed_window(connection: Connection, limit: str) -> Limit:
    found = _limit(connection, limit)
    refuse(found, "grant")
    return found


def add_recurring(
    database: Database,
    subject: str,
    limit: str,
    amount: int,
    *,
    every: str,
    rollover_max: int | None,
    until: datetime | None,
    grant_id: str,
    reason: str | None,
    priority: int,
    low: tuple[int | None, int | None],
    unsupported: dict[str, datetime | None],
    now_us: int,
) -> Grant:
    """`add_grant` with ``every``: the schedule and its first issue, in one transaction."""
    for name, value in unsupported.items():
        if value is not None:
            raise InvalidInput(name, "a recurring grant's issues start and end with its periods")
    period = parse_period(every, field_name="every")
    rollover = 0 if rollover_max is None else validate_count("rollover_max", rollover_max)
    until_us = None if until is None else to_us(until, field_name="until")
    if until_us is not None and until_us <= now_us:
        raise InvalidInput("until", "must be in the future")

    def work(connection: Connection) -> Grant:
        found = _fixed_window(connection, limit)
        calendar = found.window == "calendar"
        zones = AllowanceStore(connection).time_zones([subject]) if calendar else {}
        end = period_end(
            period,
            calendar=calendar,
            start_us=now_us,
            until_us=until_us,
            zones=zones.get(subject, ()),
        )
        first = Issue(1, now_us, end, amount)
        schedule = ScheduleRecord(
            grant_id,
            subject,
            limit,
            amount,
            str(period),
            calendar,
            rollover,
            priority,
            until_us,
            *low,
            1,
            next_due_us(first, until_us),
            reason,
            now_us,
        )
        schedules = ScheduleStore(connection)
        existing = schedules.get(grant_id)
        if existing is not None:
            fields = (subject, limit, amount, str(period), rollover, priority, until_us, *low)
            if fields != (
                existing.subject,
                existing.limit,
                existing.amount,
                existing.every,
                existing.rollover_max,
                existing.priority,
                existing.until_us,
                existing.low_units,
                existing.low_percent,
            ):
                raise GrantConflict(grant_id)
            stored = AllowanceStore(connection).grant(grant_id)
            assert stored is not None
            return _grant_of(stored, duplicate=True)
        if AllowanceStore(connection).grant(grant_id) is not None:
            raise GrantConflict(grant_id)
        schedules.add(schedule)
        insert_issue(connection, schedule, first, now_us)
        connection.execute(BUMP_LIMITS_VERSION)
        stored = AllowanceStore(connection).grant(grant_id)
        assert stored is not None
        return _grant_of(stored)

    return database.run(work)


def validate_count(field_name: str, value: object) -> int:
    """A whole number from 0 to `MAX_GRANT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GRANT:
        raise InvalidInput(field_name, f"must be a whole number from 0 to {MAX_GRANT}")
    return value


def list_grants(
    database: Database, subject: str | None = None, limit: str | None = None
) -> list[Grant]:
    """The grants (issues of recurring ones too, after making those now due)."""
    records = _after_issuing(
        database, subject, limit, lambda c: AllowanceStore(c).grants(subject, limit)
    )
    return [_grant_of(record) for record in records]


def grants_left(grants: Iterable[Grant], now: datetime) -> dict[str, int]:
    """What is left of the grants in force at ``now``, by limit (limits with none left out)."""
    left: dict[str, int] = {}
    for grant in grants:
        in_force = grant.effective_from <= now and (
            grant.expires_at is None or grant.expires_at > now
        )
        if in_force and grant.left > 0:
            left[grant.limit] = left.get(grant.limit, 0) + grant.left
    return left


T = TypeVar("T")


def _after_issuing(
    database: Database, subject: str | None, limit: str | None, read: Callable[[Connection], T]
) -> T:
    """``read`` (filtered by ``subject`` and ``limit``, validated here) in a
    transaction that first makes every recurring issue now due; a read alone
    (on SQLite no write lock) while none is due."""
    validate_filters(subject, limit)
    now_us = database.now_us()
    if not database.read(lambda connection: ScheduleStore(connection).any_due(now_us)):
        return database.read(read)

    def work(connection: Connection) -> T:
        issue_due(connection, None, now_us)
        return read(connection)

    return database.run(work)


@dataclass(frozen=True, slots=True)
class RecurringGrant:
    """A recurring grant as callers see it: its terms, its last issue and the next one's time."""

    grant_id: str
    subject: str
    limit: str
    amount: int
    every: str
    rollover_max: int
    priority: int
    until: datetime | None
    low: str | None
    last_issue: int
    next_issue_at: datetime | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


def list_recurring(
    database: Database, subject: str | None = None, limit: str | None = None
) -> list[RecurringGrant]:
    """The recurring grants (after making the issues now due)."""
    records = _after_issuing(
        database, subject, limit, lambda c: ScheduleStore(c).listed(subject, limit)
    )
    found = []
    for r in records:
        low = None
        if r.low_units is not None:
            low = str(r.low_units)
        elif r.low_percent is not None:
            low = f"{r.low_percent}%"
        found.append(
            RecurringGrant(
                r.schedule_id,
                r.subject,
                r.limit,
                r.amount,
                r.every,
                r.rollover_max,
                r.priority,
                from_us(r.until_us) if r.until_us is not None else None,
                low,
                r.last_issue,
                from_us(r.next_issue_us) if r.next_issue_us is not None else None,
                r.reason,
            )
        )
    return found


# -- corrections ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Correction:
    """A voided event. ``charges``: (subject, limit, cost, window start, grants
    given back). ``duplicate``: the event had been voided already."""

    correction_id: str
    event_id: str
    reason: str
    created_at: datetime
    charges: tuple[tuple[str, str, int, datetime | None, tuple[tuple[str, int], ...]], ...]
    duplicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            **fields_dict(self, ("correction_id", "event_id", "reason", "created_at")),
            "charges": [
                {
                    "subject": subject,
                    "limit": limit,
                    "cost": cost,
                    "window_start": start.isoformat() if start else None,
                    "grants": [{"grant_id": g, "amount": a} for g, a in grants],
                }
                for subject, limit, cost, start, grants in self.charges
            ],
        }


def _correction_of(record: CorrectionRecord, *, duplicate: bool) -> Correction:
    charges = tuple(
        (
            str(subject),
            str(limit),
            int(cost),
            from_us(start) if start else None,
            tuple((str(g), int(a)) for g, a in grants),
        )
        for subject, limit, cost, start, grants in record.charges
    )
    return Correction(
        record.correction_id,
        record.event_id,
        record.reason,
        from_us(record.created_at_us),
        charges,
        duplicate,
    )


def void(
    database: Database,
    event_id: str,
    reason: str,
    *,
    correction_id: str | None = None,
    horizon_seconds: int = DEFAULT_HORIZON_SECONDS,
) -> Correction:
    """Reverse an allowed event's charges (see `metering.domain.corrections`).

    Idempotent: voiding an event again, or at once from elsewhere, returns
    its correction (``duplicate``); a correction id reused for another event
    raises `CorrectionConflict`. A denied or rejected event, one older than
    ``horizon_seconds`` or one never decided raise a `MeteringError`.
    """
    validate_event_id(event_id)
    validate_reason(reason)
    if correction_id is not None:
        validate_grant_id(correction_id, "correction_id")
    if isinstance(horizon_seconds, bool) or not isinstance(horizon_seconds, int):
        raise InvalidInput("horizon_seconds", "must be a whole number of seconds")
    cid = correction_id or uuid.uuid4().hex
    now_us = database.now_us()

    def work(connection: Connection) -> Correction:
        # Voids of one event take turns (its reservation, a cancel's first
        # lock, then its result): the later ones find the first's correction.
        ReservationStore(connection).get(event_id, lock=True)
        store = Store(connection)
        store.lock_result(event_id)
        allowances = AllowanceStore(connection)
        earlier = allowances.correction(correction_id=cid, event_id=event_id)
        if earlier is not None:
            if earlier.event_id != event_id:
                raise CorrectionConflict(cid, earlier.event_id)
            return _correction_of(earlier, duplicate=True)
        stored = store.fetch_results([event_id]).get(event_id)
        if stored is None:
            raise UnknownEvent(event_id)
        if stored.outcome not in ("allowed", "overage"):
            raise CorrectionRefused(event_id, f"it was {stored.outcome}; nothing was consumed")
        if stored.occurred_at_us < now_us - horizon_seconds * 1_000_000:
            days = horizon_seconds / 86_400
            raise CorrectionRefused(event_id, f"it is older than the {days:g}-day horizon")
        charges, held = _still_charged(connection, stored)
        charges = _seats_freed(store, charges, stored, now_us)
        returning = [Returning(charge, charge.cost) for charge in charges]
        gave = give_back(connection, stored, returning, now_us, past_windows=True)
        if held:  # settled by the void: a cancel after it gives nothing more
            ReservationStore(connection).settle(
                event_id, ReservationState.CANCELLED, now_us, "void", gave.given_back
            )
        rows = [r.charge.to_row(r.grants) for r in gave.charges if r.counter]
        record = CorrectionRecord(cid, event_id, reason, rows, now_us)
        if not allowances.add_correction(record):
            raise RetryTransaction("the event was voided concurrently")
        _announce(connection, record, now_us)
        return _correction_of(record, duplicate=False)

    return database.run(work)


def _still_charged(connection: Connection, stored: ResultRecord) -> tuple[list[VoidedCharge], bool]:
    """The event's charges that no cancel or commit of its reservation gave
    back already (`give_back` skips the counters a later reset cleared), and
    whether its reservation is still held (the void settles it).

    Locks the event's reservation, if it has one, before any counter (a
    cancel's order).
    """
    charges = voided_charges(stored.outcome, stored.charges)
    reservation = ReservationStore(connection).get(stored.event_id, lock=True)
    if reservation is None:
        return charges, False
    if reservation.state == ReservationState.HELD:
        return charges, True
    left = still_charged(charges, reservation.given_back)
    if charges and not left:
        raise CorrectionRefused(
            stored.event_id, "its reservation was cancelled: its cost went back then"
        )
    return left, False


def _seats_freed(
    store: Store, charges: list[VoidedCharge], stored: ResultRecord, now_us: int
) -> list[VoidedCharge]:
    """The charges with those on seat limits at what they give back
    (`free_seats`: a seat only with its value's last live event). Only the
    charges no later reset cleared leave their value, after their counters
    are locked (the seats' lock order)."""
    limits = store.load_limits(charge.key.limit for charge in charges)
    if not any(limit.distinct for limit in limits.values()):
        return charges
    keys = (charge.key for charge in charges)
    resets = store.resets_after(stored.event_id, stored.decided_at_us, keys)
    live = not_reset(charges, resets)
    store.lock_counters({charge.key for charge in live}, now_us)
    freed = iter(free_seats(store, limits, live, stored.metadata, stored.event_id))
    kept = {id(charge) for charge in live}
    return [next(freed) if id(charge) in kept else charge for charge in charges]


def _announce(connection: Connection, record: CorrectionRecord, now_us: int) -> None:
    """The ``usage.corrected`` notification, in the void's transaction."""
    correction = _correction_of(record, duplicate=False)
    document = {"type": "usage.corrected", "timestamp": _iso(now_us), "data": correction.to_dict()}
    webhooks = WebhookStore(connection)
    endpoints = webhooks.list_endpoints(enabled_only=True)
    webhooks.add_message("usage.corrected", encode_payload(document), endpoints, now_us)


def corrections(database: Database, count: int = 1000) -> list[Correction]:
    found = database.run(lambda c: AllowanceStore(c).corrections(count=count))
    return [_correction_of(record, duplicate=False) for record in found]
