"""Quarantines of the runaway breaker (docs/breaker.md): listing them and
ending one, by name (``metering quarantine release``, the admin API) or by
the signed token of the ``limit.quarantined`` webhook's release link, which
releases that quarantine only, within a week. A release starts the subject's
baseline history again, so it does not trip at once.
"""

from __future__ import annotations

from sqlalchemy import Connection

from metering.domain.events import validate_subject
from metering.domain.limits import validate_limit_name
from metering.domain.links import verify_any
from metering.engine.breakers import SECRET_NAME
from metering.errors import InvalidLimit, NotQuarantined, UnknownLimit
from metering.storage.breakers import BreakerStore, Quarantine
from metering.storage.database import Database
from metering.storage.history import portal_secrets
from metering.storage.store import Store


def list_quarantines(database: Database) -> list[Quarantine]:
    """Every quarantined subject, by limit then subject."""
    return database.run(lambda c: BreakerStore(c).quarantined())


def release(database: Database, subject: str, limit: str) -> Quarantine:
    """End ``subject``'s quarantine on ``limit``: `UnknownLimit`, or
    `NotQuarantined` when its breaker does not hold it."""
    validate_subject(subject)
    validate_limit_name(limit)
    now_us = database.now_us()

    def work(connection: Connection) -> Quarantine:
        found = Store(connection).load_limits([limit]).get(limit)
        if found is None:
            raise UnknownLimit(limit)
        if found.breaker is None:
            raise InvalidLimit("breaker", f"{limit!r} has no breaker: nothing is quarantined")
        ended = BreakerStore(connection).release((limit, subject), now_us)
        if ended is None:
            raise NotQuarantined(subject, limit)
        return ended

    return database.run(work)


def _signed(connection: Connection, token: str, now_us: int) -> Quarantine | None:
    """The quarantine a well-signed, unexpired ``token`` names, as signed."""
    keys = portal_secrets(connection, now_us, SECRET_NAME)
    signed = verify_any(keys, token, now_us // 1_000_000)
    parts = signed.split("\n") if signed is not None else []
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return Quarantine(parts[0], parts[1], int(parts[2]))


def verified_link(database: Database, token: str) -> Quarantine | None:
    """The quarantine a release link's ``token`` names, if it is still on
    (None: forged, expired, malformed or over); changes nothing."""
    now_us = database.now_us()

    def work(connection: Connection) -> Quarantine | None:
        found = _signed(connection, token, now_us)
        if found is None:
            return None
        pair = (found.limit, found.subject)
        current = BreakerStore(connection).read([pair], lock=False).get(pair)
        on = current is not None and current.quarantined_at_us == found.quarantined_at_us
        return found if on else None

    return database.read(work)


def release_by_token(database: Database, token: str) -> Quarantine | None:
    """End the quarantine a release link's ``token`` names; None (nothing
    changed) when the token is forged, expired or malformed, or that
    quarantine has already ended."""
    now_us = database.now_us()

    def work(connection: Connection) -> Quarantine | None:
        found = _signed(connection, token, now_us)
        if found is None:
            return None
        pair = (found.limit, found.subject)
        return BreakerStore(connection).release(pair, now_us, found.quarantined_at_us)

    return database.run(work)
