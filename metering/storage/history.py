"""The statements of a subject's usage history and of the usage page.

`rollup_hours`: a limit's usage per hour from ``usage_rollups`` (limits with dimensions),
one dimension key's hours summed over its values, an index range on the primary key.
`counter_windows`: a subject's counter windows starting in a period, with their denials (a
primary key range). `entitlement_changes`: a subject's maximums for a limit, every change.
`portal_secret`: the usage page links' signing key, made once; `portal_secrets` reads it (none
before the first link) and the one a rotation replaced, until its grace ends, writing nothing;
`rotate_secret` replaces it, locking the current row first so that two rotations at once run one
after the other.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from metering.storage import tables
from metering.storage.connections import RetryTransaction
from metering.storage.rollups import ROLLUPS
from metering.storage.tables import counters, entitlements


@dataclass(frozen=True, slots=True)
class WindowRow:
    limit: str
    window_start_us: int
    window_end_us: int
    used: int
    denied_count: int
    denied_cost: int
    first_denied_at_us: int | None


def rollup_hours(
    connection: Connection, subject: str, limit: str, dimension: str, from_us: int, to_us: int
) -> list[tuple[int, int]]:
    """(hour start, used) of hours starting in ``[from_us, to_us)``."""
    r = ROLLUPS.c
    query = (
        select(r.hour_start_us, func.sum(r.used))
        .where(
            r.subject == subject,
            r.limit_name == limit,
            r.dimension == dimension,
            r.hour_start_us >= from_us,
            r.hour_start_us < to_us,
        )
        .group_by(r.hour_start_us)
        .order_by(r.hour_start_us)
    )
    return [(int(hour), int(used or 0)) for hour, used in connection.execute(query)]


def counter_windows(
    connection: Connection, subject: str, limit: str | None, from_us: int, to_us: int
) -> list[WindowRow]:
    """The subject's windows (of ``limit``, or every limit) starting in
    ``[from_us, to_us)``, oldest first; token buckets (start 0) left out."""
    c = counters.c
    conditions = [
        c.subject == subject,
        c.window_start_us >= max(from_us, 1),
        c.window_start_us < to_us,
    ]
    if limit is not None:
        conditions.append(c.limit_name == limit)
    query = (
        select(
            c.limit_name,
            c.window_start_us,
            c.window_end_us,
            c.used,
            c.denied_count,
            c.denied_cost,
            c.first_denied_at_us,
        )
        .where(*conditions)
        .order_by(c.window_start_us, c.limit_name)
    )
    return [WindowRow(*row) for row in connection.execute(query)]


def entitlement_changes(
    connection: Connection, subject: str, limit: str
) -> list[tuple[int, int | None]]:
    """(effective from, maximum) of every change of the subject's maximum."""
    e = entitlements.c
    query = (
        select(e.effective_from_us, e.maximum)
        .where(e.subject == subject, e.limit_name == limit)
        .order_by(e.effective_from_us)
    )
    return [(int(start), maximum) for start, maximum in connection.execute(query)]


def portal_secret(connection: Connection, now_us: int, name: str = "portal") -> str:
    """The stored secret ``name``, made now (256 random bits) if there is none.
    Two processes making it at once: the first insert wins; the other's
    transaction runs again (`RetryTransaction`) and reads it."""
    query = select(tables.secrets.c.value).where(tables.secrets.c.name == name)
    found = connection.execute(query).scalar_one_or_none()
    if found is not None:
        return str(found)
    value = secrets.token_urlsafe(32)
    try:
        connection.execute(
            insert(tables.secrets).values(name=name, value=value, created_at_us=now_us)
        )
    except IntegrityError:  # made by another process meanwhile: read it on the retry
        raise RetryTransaction from None
    return value


def _previous(name: str) -> str:
    return f"{name}.previous"


def portal_secrets(connection: Connection, now_us: int, name: str = "portal") -> list[str]:
    """The secret ``name``, then the one it replaced while that one's grace
    lasts (``expires_at_us`` after ``now_us``); none if no link was ever made.
    It only reads: checking a link takes no write lock."""
    s = tables.secrets.c
    query = select(s.value).where(s.name == name)
    current = connection.execute(query).scalar_one_or_none()
    if current is None:
        return []
    query = select(s.value).where(s.name == _previous(name), s.expires_at_us > now_us)
    previous = connection.execute(query).scalar_one_or_none()
    return [str(current)] if previous is None else [str(current), str(previous)]


def rotate_secret(connection: Connection, now_us: int, until_us: int, name: str = "portal") -> None:
    """Make a new secret ``name``; the one it replaces stays, as
    ``<name>.previous``, until ``until_us`` (one before it goes)."""
    s = tables.secrets.c
    locked = select(s.value).where(s.name == name).with_for_update()
    old = connection.execute(locked).scalar_one_or_none()
    if old is None:
        portal_secret(connection, now_us, name)
        return
    connection.execute(delete(tables.secrets).where(s.name == _previous(name)))
    connection.execute(
        insert(tables.secrets).values(
            name=_previous(name), value=old, created_at_us=now_us, expires_at_us=until_us
        )
    )
    new = secrets.token_urlsafe(32)
    connection.execute(
        update(tables.secrets).where(s.name == name).values(value=new, created_at_us=now_us)
    )
