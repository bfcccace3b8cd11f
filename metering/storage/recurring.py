"""Recurring grants and ``grant.low`` in SQL (the rules: `metering.domain.recurring`).

Due issues are made in the transaction of whoever reads the subject's window next:
`issue_due` (the general engine, `check`, listing grants: `lock_due_issues`, then
`record_issues`), or the fast path, in its own read and write (`metering.storage.hot`),
which locks every schedule of the pairs its cache has due and learns their next issues.
Either locks the due schedules (PostgreSQL ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE``),
inserts the issues (the grant id is the schedule's id and issue number: a second insert
fails) and moves the schedule on, without a new version of the limits. Lock order:
schedules, first-use windows, counters, grants.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from metering.domain.limits import parse_period
from metering.domain.recurring import Issue, issue_id, issues_due, low_threshold, next_due_us
from metering.domain.zones import ZoneHistory
from metering.storage.allowances import AllowanceStore
from metering.storage.connections import RetryTransaction
from metering.storage.counters import Pair
from metering.storage.on_connection import OnConnection
from metering.storage.records import RecordColumns
from metering.storage.tables import grant_schedules, grants


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A recurring grant as stored."""

    schedule_id: str
    subject: str
    limit: str
    amount: int
    every: str
    calendar: bool
    rollover_max: int
    priority: int
    until_us: int | None
    low_units: int | None
    low_percent: int | None
    last_issue: int
    next_issue_us: int | None
    reason: str | None
    created_at_us: int


_SCHEDULE: Final = RecordColumns(
    ScheduleRecord, columns={"limit": "limit_name"}, read={"calendar": bool}
)
_COLUMNS: Final = tuple(grant_schedules.c[column] for column in _SCHEDULE.columns)
# The columns of a `ScheduleRecord`, for statements a driver runs (`schedule_of_values`).
SCHEDULE_COLUMNS: Final = ", ".join(_SCHEDULE.columns)
schedule_of_values: Final = _SCHEDULE.of_values


# Every schedule's next issue (what the hot path's cache reads), built once.
_DUE_TIMES: Final = select(
    grant_schedules.c.limit_name, grant_schedules.c.subject, grant_schedules.c.next_issue_us
).where(grant_schedules.c.next_issue_us.is_not(None))


class ScheduleStore(OnConnection):
    """Statements on one connection; the caller owns the transaction."""

    def add(self, record: ScheduleRecord) -> None:
        self.connection.execute(grant_schedules.insert().values(_SCHEDULE.values(record)))

    def get(self, schedule_id: str) -> ScheduleRecord | None:
        row = self.connection.execute(
            select(*_COLUMNS).where(grant_schedules.c.schedule_id == schedule_id)
        ).first()
        return _SCHEDULE.of_row(row) if row is not None else None

    def listed(self, subject: str | None = None, limit: str | None = None) -> list[ScheduleRecord]:
        query = select(*_COLUMNS)
        if subject is not None:
            query = query.where(grant_schedules.c.subject == subject)
        if limit is not None:
            query = query.where(grant_schedules.c.limit_name == limit)
        query = query.order_by(grant_schedules.c.schedule_id)
        return [_SCHEDULE.of_row(row) for row in self.connection.execute(query)]

    def due_times(self) -> dict[Pair, int]:
        """Per (limit, subject), when its earliest schedule's next issue is due."""
        found: dict[Pair, int] = {}
        for name, subject, due in self.connection.execute(_DUE_TIMES):
            found[(name, subject)] = min(due, found.get((name, subject), due))
        return found

    def any_due(self, now_us: int) -> bool:
        """Whether any schedule has an issue due at ``now_us`` (a read, no lock)."""
        query = select(grant_schedules.c.schedule_id).where(
            grant_schedules.c.next_issue_us <= now_us
        )
        return self.connection.execute(query.limit(1)).first() is not None

    def lock_due(self, pairs: Iterable[Pair] | None, now_us: int) -> list[ScheduleRecord]:
        """The schedules of ``pairs`` (None: all) with an issue due at ``now_us``, locked."""
        s = grant_schedules.c
        query = select(*_COLUMNS).where(s.next_issue_us <= now_us)
        if pairs is not None:
            wanted = sorted(set(pairs))
            if not wanted:
                return []
            query = query.where(tuple_(s.limit_name, s.subject).in_(wanted))
        if self._postgres:
            query = query.order_by(s.schedule_id.collate("C")).with_for_update()
        else:
            query = query.order_by(s.schedule_id)
        return [_SCHEDULE.of_row(row) for row in self.connection.execute(query)]


# The last issue of a schedule as `issues_of` reads it: (amount, used,
# effective from, expires at), or None: there is none to follow.
LastIssue = tuple[int, int, int, int | None]


def issues_of(
    schedule: ScheduleRecord, last: LastIssue | None, now_us: int, zones: ZoneHistory = ()
) -> list[Issue]:
    """The issues of ``schedule`` due by ``now_us``, after its ``last`` issue (read now),
    for a subject whose changes of time zone are ``zones``."""
    if last is None or last[3] is None:
        return []  # not a schedule's issue: nothing to follow
    amount, used, start_us, end_us = last[0], last[1], last[2], last[3]
    return issues_due(
        parse_period(schedule.every, field_name="every"),
        calendar=schedule.calendar,
        amount=schedule.amount,
        rollover_max=schedule.rollover_max,
        until_us=schedule.until_us,
        last=Issue(schedule.last_issue, start_us, end_us, amount),
        left_of_last=amount - used,
        now_us=now_us,
        zones=zones,
    )


def issue_due(connection: Connection, pairs: Iterable[Pair] | None, now_us: int) -> int:
    """Make the issues due by ``now_us`` of the schedules of ``pairs`` (None:
    all), each once; how many were made."""
    issued: list[tuple[ScheduleRecord, list[Issue]]] = []
    locked = lock_due_issues(connection, pairs, now_us)
    if not locked:
        return 0
    zones = AllowanceStore(connection).time_zones({s.subject for s, _ in locked if s.calendar})
    for schedule, last in locked:
        due = issues_of(schedule, last, now_us, zones.get(schedule.subject, ()))
        if due:
            issued.append((schedule, due))
    return record_issues(connection, issued, now_us)


def lock_due_issues(
    connection: Connection, pairs: Iterable[Pair] | None, now_us: int
) -> list[tuple[ScheduleRecord, LastIssue | None]]:
    """The schedules of ``pairs`` (None: all) with an issue due, locked, with their last issues."""
    found: list[tuple[ScheduleRecord, LastIssue | None]] = []
    for schedule in ScheduleStore(connection).lock_due(pairs, now_us):
        row = connection.execute(
            select(
                grants.c.amount, grants.c.used, grants.c.effective_from_us, grants.c.expires_at_us
            ).where(grants.c.grant_id == issue_id(schedule.schedule_id, schedule.last_issue))
        ).first()
        found.append((schedule, None if row is None else (row[0], row[1], row[2], row[3])))
    return found


def record_issues(
    connection: Connection, issued: Sequence[tuple[ScheduleRecord, Sequence[Issue]]], now_us: int
) -> int:
    """Insert ``issued`` (each schedule locked, with its issues due in order)
    and move the schedules on; how many were made. The limits' version stays:
    the hot path's cache learns a schedule's next issue when it next locks it
    (`metering.engine.fast`). An issue made already raises `RetryTransaction`."""
    made = 0
    for schedule, due in issued:
        for issue in due:
            insert_issue(connection, schedule, issue, now_us)
        moved = connection.execute(
            update(grant_schedules)
            .where(
                grant_schedules.c.schedule_id == schedule.schedule_id,
                grant_schedules.c.last_issue == schedule.last_issue,
            )
            .values(
                last_issue=due[-1].number, next_issue_us=next_due_us(due[-1], schedule.until_us)
            )
        )
        if moved.rowcount != 1:
            raise RetryTransaction("a recurring grant was issued concurrently")
        made += len(due)
    return made


# The columns of an issue's grant row, in `issue_row`'s order.
ISSUE_COLUMNS: Final = (
    "grant_id",
    "subject",
    "limit_name",
    "amount",
    "used",
    "effective_from_us",
    "expires_at_us",
    "reason",
    "created_at_us",
    "priority",
    "schedule_id",
    "issue_number",
    "low_at",
    "low_sent",
)


def issue_row(schedule: ScheduleRecord, issue: Issue, now_us: int) -> dict[str, Any]:
    """The grant row of one issue of ``schedule`` (`ISSUE_COLUMNS`)."""
    return {
        "grant_id": issue_id(schedule.schedule_id, issue.number),
        "subject": schedule.subject,
        "limit_name": schedule.limit,
        "amount": issue.amount,
        "used": 0,
        "effective_from_us": issue.start_us,
        "expires_at_us": issue.end_us,
        "reason": schedule.reason,
        "created_at_us": now_us,
        "priority": schedule.priority,
        "schedule_id": schedule.schedule_id,
        "issue_number": issue.number,
        "low_at": low_threshold(issue.amount, schedule.low_units, schedule.low_percent),
        "low_sent": False,
    }


def insert_issue(
    connection: Connection, schedule: ScheduleRecord, issue: Issue, now_us: int
) -> None:
    """One issue as a grant row; an issue made already raises `RetryTransaction`."""
    dialect = connection.dialect.name
    statement = (
        (postgresql if dialect == "postgresql" else sqlite)
        .insert(grants)
        .values(issue_row(schedule, issue, now_us))
        .on_conflict_do_nothing()
        .returning(grants.c.grant_id)
    )
    if connection.execute(statement).first() is None:
        raise RetryTransaction("a recurring grant's issue exists already")


__all__ = [
    "ISSUE_COLUMNS",
    "SCHEDULE_COLUMNS",
    "LastIssue",
    "ScheduleRecord",
    "ScheduleStore",
    "insert_issue",
    "issue_due",
    "issue_row",
    "issues_of",
    "lock_due_issues",
    "record_issues",
    "schedule_of_values",
]
