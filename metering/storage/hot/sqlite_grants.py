"""Grants and recurring grants on the SQLite hot path, on its sqlite3 connection.

What `metering.storage.allowances` and `metering.storage.recurring` do through
SQLAlchemy, as fixed statements on the stdlib connection, so that the direct
path (`DirectSqlite`) decides subjects with grants without a SQLAlchemy
connection. The transaction is ``BEGIN IMMEDIATE``: it holds SQLite's one
write lock, so reading is locking, and no other writer draws or issues
meanwhile. A pair's grants and its windows' draws (their counters' ``granted``)
are read in one statement (in `consume`, with the version and counter), many
pairs' a limit's in one; a batch's writes find the grants by rowid (`Rowids`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from metering.domain.grants import Balance, Pot
from metering.domain.recurring import Issue, issue_id, next_due_us
from metering.storage.allowances import DrawKey, grant_deltas
from metering.storage.counters import Pair
from metering.storage.hot import ALL_GRANTS
from metering.storage.recurring import (
    ISSUE_COLUMNS,
    SCHEDULE_COLUMNS,
    LastIssue,
    ScheduleRecord,
    issue_row,
    schedule_of_values,
)

# One pair's grants (kind 1), each row with its rowid, padded to the version
# and counter's columns (`GRANT_ROWS`), so that `metering.storage.hot.sqlite`
# reads them with those too. What a window drew on them (its counter's
# ``granted``) comes with its counter's row: the hot path reads the counter of
# every window it charges, and a decision asks only those (`with_draws`).
# Only the grants not used up and not expired at an instant (the last
# parameter: `ReadRequest.grants_since_us`).
_GRANT_PART: Final = """
SELECT 1, grant_id, amount, used, effective_from_us, expires_at_us, priority, low_at, low_sent,
       rowid, NULL, NULL, NULL
FROM grants WHERE limit_name = ? AND subject = ? AND used < amount
  AND (expires_at_us IS NULL OR expires_at_us > ?)
"""
GRANT_ROWS: Final = "UNION ALL" + _GRANT_PART
SELECT_GRANTS: Final = _GRANT_PART
# Many pairs' grants, one limit's in one statement (its subjects as one JSON
# array), each row with its rowid.
SELECT_GRANTS_GROUP: Final = """
SELECT g.subject, g.grant_id, g.amount, g.used, g.effective_from_us, g.expires_at_us,
       g.priority, g.low_at, g.low_sent, g.rowid
FROM json_each(?1) AS k CROSS JOIN grants AS g WHERE g.subject = k.value AND g.limit_name = ?2
  AND g.used < g.amount AND (g.expires_at_us IS NULL OR g.expires_at_us > ?3)
"""
# Up to this many pairs are read one statement each (`consume`).
_ONE_BY_ONE: Final = 3
SELECT_SCHEDULES: Final = f"""
SELECT {SCHEDULE_COLUMNS} FROM grant_schedules
WHERE limit_name = ? AND subject = ? ORDER BY schedule_id
"""
SELECT_LAST_ISSUE: Final = """
SELECT amount, used, effective_from_us, expires_at_us FROM grants WHERE grant_id = ?
"""
INSERT_ISSUE: Final = f"""
INSERT INTO grants ({", ".join(ISSUE_COLUMNS)})
VALUES ({", ".join("?" * len(ISSUE_COLUMNS))})
"""
MOVE_SCHEDULE: Final = """
UPDATE grant_schedules SET last_issue = ?, next_issue_us = ?
WHERE schedule_id = ? AND last_issue = ?
"""
ADD_USED: Final = "UPDATE grants SET used = used + ? WHERE grant_id = ?"
ADD_USED_AT: Final = "UPDATE grants SET used = used + ? WHERE rowid = ?"


@dataclass(slots=True)
class Rowids:
    """The rowids of the grants (by id) and of the breakers (by pair) a
    transaction read: it updates those rows by rowid, one B-tree each
    instead of a key's index and then the table (two)."""

    grants: dict[str, int] = field(default_factory=dict)
    breakers: dict[tuple[str, str], int] = field(default_factory=dict)


def read_grants(
    raw: sqlite3.Connection,
    pairs: Sequence[Pair],
    rowids: Rowids | None = None,
    since_us: int = ALL_GRANTS,
) -> tuple[dict[Pair, Pot], dict[str, tuple[int, int]]]:
    """The grants of ``pairs`` not used up nor expired at ``since_us`` (a pot
    each, empty when none is left; their windows' draws are the counters',
    `with_draws`), and those that may still announce ``grant.low``
    (`metering.storage.hot.Snapshot.watched`); their rows' rowids into ``rowids``."""
    pots: dict[Pair, Pot] = {}
    watched: dict[str, tuple[int, int]] = {}
    if len(pairs) > _ONE_BY_ONE:
        groups: dict[str, list[str]] = {}
        for name, subject in pairs:
            groups.setdefault(name, []).append(subject)
        found = Rowids() if rowids is None else rowids
        for name, subjects in groups.items():
            rows = raw.execute(SELECT_GRANTS_GROUP, (json.dumps(subjects), name, since_us))
            _pots_of_group(name, subjects, rows, pots, watched, found)
        return pots, watched
    for pair in pairs:
        rows = raw.execute(SELECT_GRANTS, (*pair, since_us))
        pot_of_rows(pair, rows, pots, watched, rowids)
    return pots, watched


def _pots_of_group(
    name: str,
    subjects: Iterable[str],
    rows: Iterable[Sequence[Any]],
    pots: dict[Pair, Pot],
    watched: dict[str, tuple[int, int]],
    rowids: Rowids,
) -> None:
    """Add the pots (one for each of ``subjects``), watched grants and rowids
    of `SELECT_GRANTS_GROUP`'s ``rows`` (of limit ``name``), as `pot_of_rows`
    finds them."""
    balances: dict[str, list[Balance]] = {subject: [] for subject in subjects}
    grant_rowids = rowids.grants
    for subject, grant_id, amount, used, start, expires, priority, low_at, sent, rowid in rows:
        balances[subject].append(Balance(grant_id, amount, used, start, expires, priority))
        if low_at is not None and not sent:
            watched[grant_id] = (low_at, used)
        grant_rowids[grant_id] = rowid
    for subject, found in balances.items():
        pots[(name, subject)] = Pot(found)


def pot_of_rows(
    pair: Pair,
    rows: Iterable[Sequence[Any]],
    pots: dict[Pair, Pot],
    watched: dict[str, tuple[int, int]],
    rowids: Rowids | None = None,
) -> None:
    """Add the pot of ``pair`` (empty if no grant is left) that `SELECT_GRANTS`'s
    (or `GRANT_ROWS`') ``rows`` hold to ``pots``, its grants that may still
    announce ``grant.low`` to ``watched`` (as `read_grants` does) and its
    rows' rowids to ``rowids``; rows of another kind are left out."""
    balances: list[Balance] = []
    for row in rows:
        if row[0] == 1:  # a grant, as `pots_of` takes it (watched if it may announce)
            _, grant_id, amount, used, start, expires, priority, low_at, sent, rowid = row[:10]
            balances.append(Balance(grant_id, amount, used, start, expires, priority))
            if low_at is not None and not sent:
                watched[grant_id] = (low_at, used)
            if rowids is not None:
                rowids.grants[grant_id] = rowid
    pots[pair] = Pot(balances)


def with_draws(pots: Mapping[Pair, Pot], drawn: Mapping[tuple[str, str, int], int]) -> None:
    """Put what each window drew on its pair's grants (``drawn``: the
    ``granted`` of the counters read, those above 0) on its pot, as
    `pots_of` puts the draws it is given (a pair with no grant has no pot:
    its draws are left out)."""
    for (name, subject, start), amount in drawn.items():
        pot = pots.get((name, subject))
        if pot is not None:
            pot.granted[start] = int(amount)


def due_schedules(
    raw: sqlite3.Connection, pairs: Sequence[Pair]
) -> list[tuple[ScheduleRecord, LastIssue | None]]:
    """The schedules of ``pairs`` (which the cache has due), with their last issues."""
    found: list[tuple[ScheduleRecord, LastIssue | None]] = []
    for name, subject in pairs:
        for row in raw.execute(SELECT_SCHEDULES, (name, subject)).fetchall():
            schedule = schedule_of_values(row)
            last_id = issue_id(schedule.schedule_id, schedule.last_issue)
            last = raw.execute(SELECT_LAST_ISSUE, (last_id,)).fetchone()
            found.append((schedule, None if last is None else (last[0], last[1], last[2], last[3])))
    return found


def write_issues(
    raw: sqlite3.Connection, issued: Sequence[tuple[ScheduleRecord, Sequence[Issue]]], now_us: int
) -> None:
    """Insert the issues and move their schedules on (as
    `metering.storage.recurring.record_issues`)."""
    for schedule, issues in issued:
        for issue in issues:
            values = issue_row(schedule, issue, now_us)
            raw.execute(INSERT_ISSUE, [values[column] for column in ISSUE_COLUMNS])
        last = issues[-1]
        moved = (last.number, next_due_us(last, schedule.until_us))
        raw.execute(MOVE_SCHEDULE, (*moved, schedule.schedule_id, schedule.last_issue))


def write_draws(
    raw: sqlite3.Connection, draws: Mapping[DrawKey, int], rowids: Rowids | None = None
) -> None:
    """Add ``draws`` (all positive: the hot path only draws) to the grants
    (the windows' counters take theirs in their own write); the rows in
    ``rowids`` (read in this transaction) by rowid."""
    known = rowids.grants if rowids is not None else {}
    at: list[tuple[int, int]] = []
    by_key: list[tuple[Any, ...]] = []
    for grant_id, amount in grant_deltas(draws):
        rowid = known.get(grant_id)
        if rowid is None:
            by_key.append((amount, grant_id))
        else:
            at.append((amount, rowid))
    _run(raw, ADD_USED_AT, at)
    _run(raw, ADD_USED, by_key)


def _run(raw: sqlite3.Connection, statement: str, rows: list[tuple[Any, ...]]) -> None:
    if len(rows) == 1:
        raw.execute(statement, rows[0])
    elif rows:
        raw.executemany(statement, rows)
