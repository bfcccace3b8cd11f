"""Counters as operators see them: listing, the seats a window holds, and reset
(an operator action)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from metering.domain.events import validate_subject
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit, is_reserved, validate_limit_name
from metering.domain.state import CounterKey, CounterState
from metering.domain.zones import ZoneHistory, window_label
from metering.errors import InvalidInput, ReservedLimit, UnknownLimit
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database
from metering.storage.distinct import DistinctStore
from metering.storage.quota_notices import notify
from metering.storage.reservations import ReservationStore
from metering.storage.store import Store


@dataclass(frozen=True, slots=True)
class Counter:
    """A counter as an operator sees it."""

    subject: str
    limit: str
    window_start: datetime | None
    window_end: datetime | None
    used: int
    denied_count: int
    denied_cost: int
    first_denied_at: datetime | None
    # A calendar window at a subject's local midnight: its zone and local label.
    time_zone: str | None = None
    local_window: str | None = None


def _validate(subject: str | None, limit: str | None) -> None:
    if subject is not None:
        validate_subject(subject)
    if limit is not None:
        validate_limit_name(limit)


def counters(database: Database, subject: str | None, limit: str | None) -> list[Counter]:
    """Counters of a subject and/or limit, every window, oldest first."""
    _validate(subject, limit)

    def work(connection: Connection) -> list[Counter]:
        rows = Store(connection).counters_of(subject, limit)
        zones = AllowanceStore(connection).time_zones({key.subject for key, _ in rows})
        if not zones:
            return [_counter(key, state) for key, state in rows]
        limits = Store(connection).load_limits({key.limit for key, _ in rows})
        return [_counter(key, state, _label(key, limits, zones)) for key, state in rows]

    return database.read(work)


def _label(
    key: CounterKey, limits: Mapping[str, Limit], zones: Mapping[str, ZoneHistory]
) -> tuple[str, str] | None:
    found = limits.get(key.limit)
    if found is None or found.window != "calendar" or found.algorithm == "token_bucket":
        return None
    window = (key.window_start_us, key.window_end_us)
    return window_label(found.parsed_period, zones.get(key.subject, ()), window)


def seats(database: Database, subject: str, limit: str, at: datetime | None) -> list[str]:
    """The values holding a seat of a distinct limit in ``subject``'s window
    at ``at`` (default: now), in order; `UnknownLimit` for no such limit."""
    validate_subject(subject)
    validate_limit_name(limit)
    at_us = database.now_us() if at is None else to_us(at)

    def work(connection: Connection) -> list[str]:
        if limit not in Store(connection).load_limits([limit]):
            raise UnknownLimit(limit)
        return DistinctStore(connection).seats(subject, limit, at_us)

    return database.read(work)


def reset(database: Database, subject: str | None, limit: str | None) -> int:
    """Clear current counters; past windows stay for reports. How many were cleared."""
    if subject is None and limit is None:
        raise InvalidInput("reset", "give a subject, a limit or both")
    _validate(subject, limit)
    if limit is not None and is_reserved(limit):
        raise ReservedLimit(limit, "reset")
    now_us = database.now_us()

    def work(connection: Connection) -> int:
        # Held units go with the rest: a later cancel returns nothing. Held
        # reservations are locked first, counters after (the lock order).
        held = ReservationStore(connection)
        held.lock_held(subject)
        store = Store(connection)
        cleared = store.delete_current_counters(subject, limit, now_us)
        held.forget_held_charges(subject, cleared)
        held.forget_overdrafts(subject, limit, cleared)  # the cleared usage's, billed no more
        # Recorded for the counters cleared while they are still locked: the
        # reset clock orders it after every result written to them and
        # before every later one, so a void skips exactly the usage it
        # cleared (`metering.domain.corrections`).
        store.record_reset(cleared, now_us)
        notify(connection, subject, limit)  # every process's leases, at commit
        return len(cleared)

    return database.run(work)


def _counter(key: CounterKey, state: CounterState, label: tuple[str, str] | None = None) -> Counter:
    windowed = key.window_end_us != 0
    return Counter(
        subject=key.subject,
        limit=key.limit,
        window_start=from_us(key.window_start_us) if windowed else None,
        window_end=from_us(key.window_end_us) if windowed else None,
        used=state.used,
        denied_count=state.denied_count,
        denied_cost=state.denied_cost,
        first_denied_at=from_us(state.first_denied_at_us)
        if state.first_denied_at_us is not None
        else None,
        time_zone=label[0] if label else None,
        local_window=label[1] if label else None,
    )
