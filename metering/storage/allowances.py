"""Entitlements, grants and corrections in SQL (see `metering.domain.grants`).

The general engine and voids read a subject's grants under lock *after* its
counters, so the lock order stays: first-use windows, counters, grants. The
PostgreSQL hot path reads them after the counters without a lock, and the
grants' check (``used <= amount``) refuses a draw on a balance another
transaction spent meanwhile (`metering.storage.hot.postgres`). Creating a
grant or changing an entitlement bumps the limits' version: every process's
`LimitCache` learns of it in the same statement that reads the version, so
the hot path never looks them up per event.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    bindparam,
    case,
    cast,
    func,
    or_,
    select,
    tuple_,
    update,
)

from metering.domain.decisions import ROW_FIELDS
from metering.domain.grants import DEFAULT_PRIORITY, Balance, Entitlement, History, Pot
from metering.domain.notifications import grant_low_document
from metering.domain.zones import UTC_ZONE, ZoneHistory
from metering.storage.counters import Pair
from metering.storage.limits import BUMP_LIMITS_VERSION
from metering.storage.on_connection import OnConnection, chunks
from metering.storage.records import RecordColumns
from metering.storage.tables import (
    corrections,
    counters,
    entitlements,
    grants,
    subject_time_zones,
)
from metering.storage.webhook_records import encode_payload
from metering.storage.webhooks import WebhookStore

# (limit, subject, window start, grant id) -> amount drawn
DrawKey = tuple[str, str, int, str]
# A grant as both hot paths and the general engine read it: (limit, subject,
# grant id, amount, used, effective from, expires at, priority); and what a window drew
# on a pair's grants: (limit, subject, window start, amount).
GrantRow = Sequence[Any]
DrawRow = Sequence[Any]


def draws_of(rows: Iterable[Sequence[Any]]) -> dict[DrawKey, int]:
    """What decided charges (ledger rows, `ChargeDecision.to_row` order) drew on
    grants, by window and grant: a row lists its draws only if it consumed."""
    draws: dict[DrawKey, int] = defaultdict(int)
    for row in rows:
        if len(row) > ROW_FIELDS:
            for grant_id, amount in row[ROW_FIELDS]:
                draws[(row[1], row[0], row[9], grant_id)] += amount
    return draws


def grant_deltas(
    draws: Mapping[DrawKey, int], only: Container[str] | None = None
) -> list[tuple[str, int]]:
    """What ``draws`` add to each grant's ``used`` (of those in ``only``,
    when given), by grant id, sorted: the lock order of grant rows."""
    if len(draws) == 1 and only is None:  # (most batches: one draw)
        [(key, amount)] = draws.items()
        return [(key[3], amount)]
    by_grant: dict[str, int] = defaultdict(int)
    for (_, _, _, grant_id), amount in draws.items():
        if only is None or grant_id in only:
            by_grant[grant_id] += amount
    return sorted(by_grant.items())


def drawn_by_window(draws: Mapping[DrawKey, int]) -> dict[tuple[str, str, int], int]:
    """What ``draws`` add to each window's counter (``counters.granted``), by
    (limit, subject, window start)."""
    if len(draws) == 1:  # (most batches: one draw)
        [(key, amount)] = draws.items()
        return {key[:3]: amount}
    by_window: dict[tuple[str, str, int], int] = defaultdict(int)
    for (name, subject, start, _), amount in draws.items():
        by_window[(name, subject, start)] += amount
    return by_window


def pots_of(
    grant_rows: Iterable[GrantRow], draw_rows: Iterable[DrawRow], pairs: Iterable[Pair] = ()
) -> dict[Pair, Pot]:
    """Each pair's grants as a `Pot`, with what its windows drew (a pair with
    no grant row has no pot, and its draws are left out, unless it is in
    ``pairs``: its pot is then empty)."""
    balances: dict[Pair, list[Balance]] = {pair: [] for pair in pairs}
    for row in grant_rows:  # (more columns may follow: ignored)
        pair = (row[0], row[1])
        found = balances.get(pair)
        if found is None:
            balances[pair] = [Balance(*row[2:8])]
        else:
            found.append(Balance(*row[2:8]))
    pots = {pair: Pot(found) for pair, found in balances.items()}  # (each sorts its own)
    for name, subject, start, amount in draw_rows:
        pot = pots.get((name, subject))
        if pot is not None:
            pot.granted[start] = int(amount)
    return pots


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A grant as stored: ``used`` of ``amount`` so far."""

    grant_id: str
    subject: str
    limit: str
    amount: int
    used: int
    effective_from_us: int
    expires_at_us: int | None
    reason: str | None
    created_at_us: int
    priority: int = DEFAULT_PRIORITY
    schedule_id: str | None = None
    issue_number: int | None = None
    low_at: int | None = None
    low_sent: bool = False


@dataclass(frozen=True, slots=True)
class CorrectionRecord:
    """A voided event: ``charges`` as [subject, limit, cost, window start, [[grant, restored]]]."""

    correction_id: str
    event_id: str
    reason: str
    charges: list[list[Any]]
    created_at_us: int


_GRANT: Final = RecordColumns(GrantRecord, columns={"limit": "limit_name"}, read={"low_sent": bool})
_GRANT_COLUMNS: Final = tuple(grants.c[column] for column in _GRANT.columns)
_ENTITLEMENT: Final = RecordColumns(Entitlement, columns={"limit": "limit_name"})
_CORRECTION: Final = RecordColumns(
    CorrectionRecord,
    read={"charges": json.loads},
    write={"charges": lambda charges: json.dumps(charges, separators=(",", ":"))},
)


# What the hot path's cache reads on every reload, built once: a statement
# used again needs no new cache key.
_HISTORIES: Final = select(
    entitlements.c.limit_name,
    entitlements.c.subject,
    entitlements.c.effective_from_us,
    entitlements.c.maximum,
)
_TIME_ZONES: Final = select(
    subject_time_zones.c.subject, subject_time_zones.c.since_us, subject_time_zones.c.time_zone
).order_by(subject_time_zones.c.subject, subject_time_zones.c.since_us)
_GRANT_PAIRS: Final = select(grants.c.limit_name, grants.c.subject).distinct()


class AllowanceStore(OnConnection):
    """Statements on one connection; the caller owns the transaction."""

    # -- entitlements ------------------------------------------------------

    def set_entitlement(self, change: Entitlement) -> None:
        """Record a change of maximum; one at the same instant is replaced."""
        key = ["subject", "limit_name", "effective_from_us"]
        self._upsert(entitlements, _ENTITLEMENT.values(change), key, changed=["maximum"])
        self.connection.execute(BUMP_LIMITS_VERSION)

    def entitlements(
        self, subject: str | None = None, limit: str | None = None
    ) -> list[Entitlement]:
        query = select(entitlements)
        if subject is not None:
            query = query.where(entitlements.c.subject == subject)
        if limit is not None:
            query = query.where(entitlements.c.limit_name == limit)
        query = query.order_by(
            entitlements.c.limit_name, entitlements.c.subject, entitlements.c.effective_from_us
        )
        return [_ENTITLEMENT.of_row(r) for r in self.connection.execute(query)]

    def histories(self, pairs: Iterable[Pair] | None = None) -> dict[Pair, History]:
        """Each (limit, subject)'s changes of maximum, in time order (every pair: None)."""
        query = _HISTORIES
        if pairs is not None:
            wanted = sorted(set(pairs))
            if not wanted:
                return {}
            query = query.where(
                tuple_(entitlements.c.limit_name, entitlements.c.subject).in_(wanted)
            )
        found: dict[Pair, list[tuple[int, int | None]]] = defaultdict(list)
        for name, subject, start, maximum in self.connection.execute(query):
            found[(name, subject)].append((start, maximum))
        return {pair: tuple(sorted(changes)) for pair, changes in found.items()}

    # -- time zones --------------------------------------------------------

    def set_time_zone(self, subject: str, zone: str, now_us: int) -> bool:
        """Record ``subject``'s change to ``zone`` at ``now_us``; False (nothing
        written) if that is its zone already (UTC when it never had one)."""
        history = self.time_zones([subject]).get(subject, ())
        if (history[-1][1] if history else UTC_ZONE) == zone:
            return False
        row = {"subject": subject, "since_us": now_us, "time_zone": zone}
        self._upsert(subject_time_zones, row, ["subject", "since_us"], changed=["time_zone"])
        self.connection.execute(BUMP_LIMITS_VERSION)
        return True

    def time_zones(self, subjects: Iterable[str] | None = None) -> dict[str, ZoneHistory]:
        """Each subject's changes of zone, oldest first (every subject that has one: None)."""
        z = subject_time_zones.c
        query = _TIME_ZONES
        if subjects is not None:
            wanted = sorted(set(subjects))
            if not wanted:
                return {}
            query = query.where(z.subject.in_(wanted))
        found: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for subject, since_us, zone in self.connection.execute(query):
            found[subject].append((since_us, zone))
        return {subject: tuple(changes) for subject, changes in found.items()}

    # -- grants ------------------------------------------------------------

    def add_grant(self, record: GrantRecord) -> GrantRecord | None:
        """Insert a grant; None if its id exists (the caller compares with `grant`)."""
        values = {**_GRANT.values(record), "used": 0, "low_sent": False}
        statement = (
            self._insert(grants)
            .values(values)
            .on_conflict_do_nothing()
            .returning(grants.c.grant_id)
        )
        if self.connection.execute(statement).first() is None:
            return None
        self.connection.execute(BUMP_LIMITS_VERSION)
        return record

    def grant(self, grant_id: str) -> GrantRecord | None:
        row = self.connection.execute(
            select(*_GRANT_COLUMNS).where(grants.c.grant_id == grant_id)
        ).first()
        return _GRANT.of_row(row) if row is not None else None

    def grants(
        self, subject: str | None = None, limit: str | None = None, count: int = 1000
    ) -> list[GrantRecord]:
        query = select(*_GRANT_COLUMNS)
        if subject is not None:
            query = query.where(grants.c.subject == subject)
        if limit is not None:
            query = query.where(grants.c.limit_name == limit)
        query = query.order_by(grants.c.subject, grants.c.limit_name, grants.c.grant_id)
        return [_GRANT.of_row(row) for row in self.connection.execute(query.limit(count))]

    def grants_left(self, pairs: Iterable[Pair], now_us: int) -> dict[Pair, int]:
        """What is left of the grants in force at ``now_us`` of each of ``pairs``
        (limit, subject) that has some (as `metering.allowances.service.grants_left`)."""
        wanted = sorted(set(pairs))
        g = grants.c
        left = cast(func.sum(g.amount - g.used), BigInteger)
        found: dict[Pair, int] = {}
        for chunk in chunks(wanted):
            query = (
                select(g.limit_name, g.subject, left)
                .where(
                    tuple_(g.limit_name, g.subject).in_(chunk),
                    g.effective_from_us <= now_us,
                    or_(g.expires_at_us.is_(None), g.expires_at_us > now_us),
                    g.used < g.amount,
                )
                .group_by(g.limit_name, g.subject)
            )
            for name, subject, amount in self.connection.execute(query):
                found[(name, subject)] = int(amount)
        return found

    def grant_pairs(self) -> set[Pair]:
        """Every (limit, subject) that has a grant (the hot path reads grants only for these)."""
        return {(name, subject) for name, subject in self.connection.execute(_GRANT_PAIRS)}

    def lock_pots(
        self,
        pairs: Iterable[Pair],
        windows: Iterable[tuple[str, str, int]] | None,
        *,
        lock: bool = True,
    ) -> dict[Pair, Pot]:
        """Lock the grants of ``pairs`` (sorted by id; ``lock=False``: only read
        them) and read what ``windows`` (None: every window of the pairs) drew
        on them. Pairs without grants have no pot."""
        wanted = sorted(set(pairs))
        if not wanted:
            return {}
        g = grants.c
        query = select(
            g.limit_name,
            g.subject,
            g.grant_id,
            g.amount,
            g.used,
            g.effective_from_us,
            g.expires_at_us,
            g.priority,
        ).where(tuple_(g.limit_name, g.subject).in_(wanted))
        # Locked in the hot path's order: by pair, then by id, in code point order.
        if self._postgres:
            query = query.order_by(
                g.limit_name.collate("C"), g.subject.collate("C"), g.grant_id.collate("C")
            )
        else:
            query = query.order_by(g.limit_name, g.subject, g.grant_id)
        if self._postgres and lock:
            query = query.with_for_update()
        grant_rows = self.connection.execute(query).all()
        owners = sorted({(row[0], row[1]) for row in grant_rows})
        if not owners:
            return {}
        c = counters.c
        drawn = select(c.limit_name, c.subject, c.window_start_us, c.granted).where(c.granted != 0)
        if windows is None:  # every window of the pairs
            drawn = drawn.where(tuple_(c.limit_name, c.subject).in_(owners))
        else:
            keys = sorted({key for key in windows if (key[0], key[1]) in set(owners)})
            drawn = drawn.where(tuple_(c.limit_name, c.subject, c.window_start_us).in_(keys))
        return pots_of(grant_rows, self.connection.execute(drawn))

    def write_draws(
        self,
        draws: Mapping[DrawKey, int],
        restore: set[str] | None = None,
        *,
        now_us: int | None = None,
    ) -> None:
        """Add ``draws`` (negative: given back) to their windows' draws and to
        the grants (only those in ``restore``, when given). With ``now_us``,
        a grant the draws left low announces ``grant.low`` (once)."""
        if not draws:
            return
        by_grant = grant_deltas(draws, restore)
        if by_grant:
            self.connection.execute(
                update(grants)
                .where(grants.c.grant_id == bindparam("gid"))
                .values(used=grants.c.used + bindparam("delta")),
                [{"gid": gid, "delta": delta} for gid, delta in by_grant],
            )
            drawn = [gid for gid, delta in by_grant if delta > 0]
            if now_us is not None and drawn:
                self.announce_low(drawn, now_us)
        by_window = drawn_by_window(draws)
        # On the windows' counters (written before, in this transaction); taken
        # back, never below zero (a reset may have cleared the window).
        rows = [
            {"b_name": n, "b_subject": s, "b_start": w, "b_delta": a}
            for (n, s, w), a in sorted(by_window.items())
            if a
        ]
        if not rows:
            return
        c = counters.c
        added = c.granted + bindparam("b_delta", type_=BigInteger)
        self.connection.execute(
            update(counters)
            .where(
                c.limit_name == bindparam("b_name"),
                c.subject == bindparam("b_subject"),
                c.window_start_us == bindparam("b_start"),
            )
            .values(granted=case((added < 0, 0), else_=added)),
            rows,
        )

    def announce_low(self, grant_ids: list[str], now_us: int) -> None:
        """``grant.low`` for the grants of ``grant_ids`` now at or below their
        threshold and not announced yet; marks them announced."""
        g = grants.c
        found = self.connection.execute(
            update(grants)
            .where(
                g.grant_id.in_(grant_ids),
                g.low_at.is_not(None),
                g.low_sent.is_(False),
                g.amount - g.used <= g.low_at,
            )
            .values(low_sent=True)
            .returning(
                g.grant_id, g.subject, g.limit_name, g.amount, g.used, g.low_at, g.schedule_id
            )
        ).all()
        if not found:
            return
        webhooks = WebhookStore(self.connection)
        endpoints = webhooks.list_endpoints(enabled_only=True)
        for row in sorted(found):
            document = grant_low_document(tuple(row), now_us)
            webhooks.add_message("grant.low", encode_payload(document), endpoints, now_us)

    def add_correction(self, record: CorrectionRecord) -> bool:
        """Insert a correction; False if its id or its event was corrected already."""
        statement = (
            self._insert(corrections)
            .values(_CORRECTION.values(record))
            .on_conflict_do_nothing()
            .returning(corrections.c.correction_id)
        )
        return self.connection.execute(statement).first() is not None

    def correction(
        self, *, correction_id: str | None = None, event_id: str | None = None
    ) -> CorrectionRecord | None:
        conditions = []
        if correction_id is not None:
            conditions.append(corrections.c.correction_id == correction_id)
        if event_id is not None:
            conditions.append(corrections.c.event_id == event_id)
        row = self.connection.execute(select(corrections).where(or_(*conditions))).first()
        return _CORRECTION.of_row(row) if row is not None else None

    def corrections(
        self, since_us: int | None = None, until_us: int | None = None, count: int = 1000
    ) -> list[CorrectionRecord]:
        query = select(corrections)
        if since_us is not None:
            query = query.where(corrections.c.created_at_us >= since_us)
        if until_us is not None:
            query = query.where(corrections.c.created_at_us < until_us)
        query = query.order_by(corrections.c.created_at_us, corrections.c.correction_id)
        return [_CORRECTION.of_row(row) for row in self.connection.execute(query.limit(count))]
