"""Breakers, webhook notices and ``grant.low``, read and written by the hot
stores with the counters, on PostgreSQL and SQLite.

`HotStore.read` locks the breakers asked for after the counters and reads
the breaker links' secret (on SQLite, one event's in its counter's
statement); `HotStore.write` stores the breakers stepped (and
the secret, when it makes it), marks ``grant.low`` and records notices as
`WebhookStore.record_notices` does (a new mark: its message and deliveries).
On PostgreSQL each is a statement of the write's pipeline; a grant's first
``grant.low`` writes its message after it, before the COMMIT.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final

from metering.domain.breaker import Breaker, breaker_of
from metering.domain.notifications import Notice, grant_low_document
from metering.storage.counters import Pair
from metering.storage.webhook_records import encode_payload

# The name of the breaker links' secret (`metering.storage.history.portal_secret`).
BREAKER_SECRET: Final = "breaker"
READ_SECRET: Final = "SELECT value FROM secrets WHERE name = %(secret)s"
# A secret made by this write: one made meanwhile by another transaction
# fails the key, and the transaction runs again, reading it.
INSERT_SECRET: Final = """
INSERT INTO secrets (name, value, created_at_us) VALUES (%(name)s, %(value)s, %(now)s)
"""

_BREAKER_COLUMNS: Final = (
    "short_rate, long_rate, rate_at_us, since_us, over_since_us, quarantined_at_us"
)

LOCK_BREAKERS: Final = f"""
SELECT b.limit_name, b.subject, {", ".join("b." + c for c in _BREAKER_COLUMNS.split(", "))},
       b.tid::text
FROM jsonb_array_elements(%(breaker_pairs)s::jsonb) AS r
CROSS JOIN LATERAL (
    SELECT *, ctid AS tid FROM breakers AS b
    WHERE b.limit_name = r->>0 AND b.subject = r->>1 FOR UPDATE
) AS b
"""

_BREAKER_SET: Final = ", ".join(f"{c} = excluded.{c}" for c in _BREAKER_COLUMNS.split(", "))

UPSERT_BREAKERS: Final = f"""
INSERT INTO breakers (limit_name, subject, {_BREAKER_COLUMNS})
SELECT r->>0, r->>1, (r->>2)::float8, (r->>3)::float8, (r->>4)::bigint, (r->>5)::bigint,
       (r->>6)::bigint, (r->>7)::bigint
FROM jsonb_array_elements(%(rows)s::jsonb) AS r
ON CONFLICT (subject, limit_name) DO UPDATE SET {_BREAKER_SET}
"""

# The breakers `LOCK_BREAKERS` locked, updated through their tuple ids (as the
# counters are): no conflict to look for, no plan over the key.
UPDATE_BREAKERS: Final = """
UPDATE breakers AS b
SET short_rate = v.short, long_rate = v.long, rate_at_us = v.at, since_us = v.since,
    over_since_us = v.over, quarantined_at_us = v.held
FROM (
    SELECT (r->>0)::tid, (r->>1)::float8, (r->>2)::float8, (r->>3)::bigint, (r->>4)::bigint,
           (r->>5)::bigint, (r->>6)::bigint
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
) AS v(tid, short, long, at, since, over, held)
WHERE b.ctid = v.tid
"""

# The deliveries of the messages ``written`` (id, position), per enabled
# endpoint that wants their type, in the order of the messages then of the endpoints.
_DELIVERIES: Final = """
INSERT INTO webhook_deliveries (message_id, endpoint_id, status, attempts, next_attempt_at_us,
                                created_at_us, updated_at_us)
SELECT w.id, e.id, 'pending', 0, %(now)s, %(now)s, %(now)s
FROM written AS w
JOIN webhook_endpoints AS e
  ON e.enabled AND (e.types::jsonb = '[]'::jsonb OR e.types::jsonb ? w.type)
ORDER BY w.n, e.created_at_us, e.id
"""

# Notices (`notice_rows`, one per mark): the mark inserted or ignored, and
# for a new one its message and deliveries.
RECORD_NOTICES: Final = f"""
WITH n AS (
    SELECT r->>0 AS l, r->>1 AS s, (r->>2)::bigint AS ws, r->>3 AS kind, (r->>4)::bigint AS we,
           (r->>5)::bigint AS mx, r->>6 AS ev, (r->>7)::bigint AS due, r->>8 AS id,
           r->>9 AS type, r->>10 AS payload, e.n
    FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS e(r, n)
),
marked AS (
    INSERT INTO webhook_marks (limit_name, subject, window_start_us, kind, window_end_us,
                               maximum, event_id, created_at_us, due_at_us)
    SELECT l, s, ws, kind, we, mx, ev, %(now)s, due FROM n ORDER BY n
    ON CONFLICT DO NOTHING
    RETURNING limit_name, subject, window_start_us, kind
),
made AS (
    INSERT INTO webhook_messages (id, type, payload, created_at_us)
    SELECT n.id, n.type, n.payload, %(now)s
    FROM n JOIN marked AS m
      ON m.limit_name = n.l AND m.subject = n.s AND m.window_start_us = n.ws AND m.kind = n.kind
    ORDER BY n.n
    RETURNING id
),
written AS (SELECT n.id, n.type, n.n FROM made JOIN n ON n.id = made.id)
{_DELIVERIES}
"""

# The grants of ``ids`` at or below their threshold and not announced yet,
# marked announced, returned for their ``grant.low`` (`low_documents`).
MARK_LOW: Final = """
UPDATE grants AS g SET low_sent = true
WHERE g.grant_id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb))
  AND g.low_at IS NOT NULL AND NOT g.low_sent AND g.amount - g.used <= g.low_at
RETURNING g.grant_id, g.subject, g.limit_name, g.amount, g.used, g.low_at, g.schedule_id
"""

# Messages (id, type, payload), each with its deliveries.
INSERT_MESSAGES: Final = f"""
WITH n AS (
    SELECT r->>0 AS id, r->>1 AS type, r->>2 AS payload, e.n
    FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS e(r, n)
),
made AS (
    INSERT INTO webhook_messages (id, type, payload, created_at_us)
    SELECT id, type, payload, %(now)s FROM n ORDER BY n
    RETURNING id
),
written AS (SELECT n.id, n.type, n.n FROM made JOIN n ON n.id = made.id)
{_DELIVERIES}
"""

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def new_secret() -> str:
    """A secret's value, as `metering.storage.history.portal_secret` makes one."""
    return secrets.token_urlsafe(32)


def breaker_rows(changed: dict[Pair, Breaker]) -> list[tuple[Any, ...]]:
    return [(limit, subject, *b) for (limit, subject), b in sorted(changed.items())]


def _write_breakers(
    raw: sqlite3.Connection, breakers: dict[Pair, Breaker], rowids: Mapping[Pair, int]
) -> None:
    at: list[tuple[Any, ...]] = []
    by_key: list[tuple[Any, ...]] = []
    for pair, b in breakers.items():
        rowid = rowids.get(pair)
        if rowid is None:
            by_key.append((*pair, *b))
        else:
            at.append((*b, rowid))
    for statement, rows in ((SQLITE_UPDATE_BREAKER, at), (SQLITE_UPSERT_BREAKER, by_key)):
        if len(rows) == 1:  # (`consume`: `execute` costs less than `executemany`)
            raw.execute(statement, rows[0])
        elif rows:
            raw.executemany(statement, rows)


def notice_rows(notices: Sequence[tuple[Notice, str]]) -> list[tuple[Any, ...]]:
    """One row per mark (the first notice of each: a later one of the same
    mark would find it inserted), with a new message id."""
    rows: list[tuple[Any, ...]] = []
    seen: set[tuple[str, str, int, str]] = set()
    for notice, payload in notices:
        mark = (notice.limit, notice.subject, notice.window_start_us, notice.mark)
        if mark in seen:
            continue
        seen.add(mark)
        rows.append(
            (
                *mark,
                notice.window_end_us,
                notice.maximum,
                notice.event_id,
                notice.due_at_us,
                "msg_" + secrets.token_hex(12),
                notice.type,
                payload,
            )
        )
    return rows


def pg_notice_params(notices: Sequence[tuple[Notice, str]], now_us: int) -> dict[str, Any]:
    return {"rows": _encode(notice_rows(notices)), "now": now_us}


def pg_low_params(grant_ids: Sequence[str]) -> dict[str, Any]:
    return {"ids": _encode(sorted(grant_ids))}


def low_documents(rows: Sequence[Sequence[Any]], now_us: int) -> list[tuple[str, str]]:
    """The ``grant.low`` messages (type, payload) of `MARK_LOW`'s rows, as
    `AllowanceStore.announce_low` writes them."""
    found: list[tuple[str, str]] = []
    for row in sorted(map(tuple, rows)):
        found.append(("grant.low", encode_payload(grant_low_document(row, now_us))))
    return found


def pg_message_params(messages: Sequence[tuple[str, str]], now_us: int) -> dict[str, Any]:
    rows = [("msg_" + secrets.token_hex(12), kind, payload) for kind, payload in messages]
    return {"rows": _encode(rows), "now": now_us}


def pg_breaker_params(changed: dict[Pair, Breaker]) -> dict[str, Any]:
    return {"rows": _encode(breaker_rows(changed))}


def pg_breaker_updates(changed: dict[Pair, Breaker], tids: dict[Pair, str]) -> dict[str, Any]:
    """`UPDATE_BREAKERS`' rows: each changed breaker (all locked) by its tuple id."""
    rows = [(tids[pair], *b) for pair, b in changed.items()]
    return {"rows": _encode(rows)}


# SQLite: the same, statement by statement (no round trip to save).
SQLITE_READ_SECRET: Final = "SELECT value FROM secrets WHERE name = ?"
SQLITE_INSERT_SECRET: Final = "INSERT INTO secrets (name, value, created_at_us) VALUES (?, ?, ?)"
# A limit's breakers of the subjects given as one JSON array (no pair
# parsed out of JSON per row), with their rowids.
SQLITE_READ_BREAKERS: Final = f"""
SELECT b.subject, {", ".join("b." + c for c in _BREAKER_COLUMNS.split(", "))}, b.rowid
FROM json_each(?) AS k
JOIN breakers AS b ON b.subject = k.value AND b.limit_name = ?
"""
# The same two reads as parts of the version and counter's statement of
# `metering.storage.hot.sqlite` (one breaker: `consume`): a breaker (kind 3)
# and the secret (kind 4), padded to its thirteen columns.
SQLITE_BREAKER_ROWS: Final = f"""
UNION ALL
SELECT 3, {_BREAKER_COLUMNS}, rowid, NULL, NULL, NULL, NULL, NULL
FROM breakers WHERE limit_name = ? AND subject = ?
UNION ALL
SELECT 4, value, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM secrets
WHERE name = ?
"""
SQLITE_UPSERT_BREAKER: Final = f"""
INSERT INTO breakers (limit_name, subject, {_BREAKER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (subject, limit_name) DO UPDATE SET {_BREAKER_SET}
"""
# A breaker read in the transaction, updated through its rowid: one B-tree,
# not the key's index and then the table.
SQLITE_UPDATE_BREAKER: Final = f"""
UPDATE breakers SET {", ".join(c + " = ?" for c in _BREAKER_COLUMNS.split(", "))} WHERE rowid = ?
"""
SQLITE_MARK: Final = """
INSERT INTO webhook_marks (limit_name, subject, window_start_us, kind, window_end_us, maximum,
                           event_id, created_at_us, due_at_us)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING
RETURNING kind
"""
SQLITE_ENDPOINTS: Final = """
SELECT id, types FROM webhook_endpoints WHERE enabled ORDER BY created_at_us, id
"""
SQLITE_MESSAGE: Final = """
INSERT INTO webhook_messages (id, type, payload, created_at_us) VALUES (?, ?, ?, ?)
"""
SQLITE_DELIVERY: Final = """
INSERT INTO webhook_deliveries (message_id, endpoint_id, status, attempts, next_attempt_at_us,
                                created_at_us, updated_at_us)
VALUES (?, ?, 'pending', 0, ?, ?, ?)
"""
SQLITE_LOW: Final = """
UPDATE grants SET low_sent = 1
WHERE grant_id IN (SELECT value FROM json_each(?))
  AND low_at IS NOT NULL AND NOT low_sent AND amount - used <= low_at
RETURNING grant_id, subject, limit_name, amount, used, low_at, schedule_id
"""


def sqlite_breakers(
    raw: sqlite3.Connection, pairs: Sequence[Pair], rowids: dict[Pair, int]
) -> dict[Pair, Breaker]:
    """The breakers of ``pairs`` that have one, a statement per limit; their
    rows' rowids into ``rowids``."""
    subjects: dict[str, list[str]] = {}
    for name, subject in pairs:
        subjects.setdefault(name, []).append(subject)
    found = {}
    for name, some in subjects.items():
        for row in raw.execute(SQLITE_READ_BREAKERS, (json.dumps(some), name)):
            pair = (name, row[0])
            found[pair] = breaker_of(row[1:7])
            rowids[pair] = row[7]
    return found


def sqlite_secret(raw: sqlite3.Connection, name: str) -> str | None:
    row = raw.execute(SQLITE_READ_SECRET, (name,)).fetchone()
    return None if row is None else str(row[0])


def sqlite_write_extras(
    raw: sqlite3.Connection,
    breakers: dict[Pair, Breaker],
    low: Sequence[str],
    notices: Sequence[tuple[Notice, str]],
    now_us: int,
    secret: str | None = None,
    rowids: Mapping[Pair, int] | None = None,
) -> None:
    """The breakers (those read in this transaction, with their ``rowids``,
    updated by rowid), the breaker links' ``secret`` when made now,
    ``grant.low`` and the notices of one write."""
    if secret is not None:
        raw.execute(SQLITE_INSERT_SECRET, (BREAKER_SECRET, secret, now_us))
    if breakers:
        _write_breakers(raw, breakers, rowids or {})
    endpoints: list[tuple[str, str]] | None = None
    messages: list[tuple[str, str]] = []
    if low:
        found = raw.execute(SQLITE_LOW, (json.dumps(sorted(low)),)).fetchall()
        messages.extend(low_documents(found, now_us))
    for row in notice_rows(notices):
        mark = (*row[:8],)
        values = (*mark[:7], now_us, mark[7])
        if raw.execute(SQLITE_MARK, values).fetchall():  # (run to its end)
            messages.append((row[9], row[10]))
    for message_type, payload in messages:
        if endpoints is None:
            endpoints = [(e, t) for e, t in raw.execute(SQLITE_ENDPOINTS)]
        message_id = "msg_" + secrets.token_hex(12)
        raw.execute(SQLITE_MESSAGE, (message_id, message_type, payload, now_us))
        for endpoint_id, types in endpoints:
            wanted = json.loads(types)
            if not wanted or message_type in wanted:
                raw.execute(SQLITE_DELIVERY, (message_id, endpoint_id, now_us, now_us, now_us))
