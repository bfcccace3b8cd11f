"""Recurring grants: one grant *issued* per period, with rollover; and ``grant.low``.

A schedule gives ``amount`` every period (``every``): its first issue when added, for the
rest of the current period; each later one at a period start (the calendar boundaries of
``every`` on a calendar limit, at the subject's local midnights when it has a time zone as
its windows are, `metering.domain.zones`; every ``every`` from the grant's own start on a
first-use one). An issue expires at its period's end or at ``until``; none starts at or after
``until``. An issue's amount is ``amount`` plus the previous issue's unused part, read when
the issue is made, up to ``rollover_max``. Issues are made when the window is next read
(`issues_due`), not by a timer. `low_threshold` is a grant's ``grant.low`` level in units.
Pure arithmetic (docs/allowances.md): `metering.storage.recurring` runs it in transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from metering.domain.bounds import shown
from metering.domain.limits import Period
from metering.domain.windows import add_period, calendar_window
from metering.domain.zones import ZoneHistory
from metering.errors import InvalidInput

MAX_ISSUES_AT_ONCE: Final = 1200  # ten years of monthly issues in one reading


@dataclass(frozen=True, slots=True)
class Issue:
    """One issue of a schedule: its number (1 is the first), its period and amount."""

    number: int
    start_us: int
    end_us: int
    amount: int


def issue_id(schedule_id: str, number: int) -> str:
    """The grant id of a schedule's ``number``-th issue: the schedule's id for the
    first (so a one-off grant and a recurring one list alike), ``id/n`` after."""
    return schedule_id if number == 1 else f"{schedule_id}/{number}"


def period_end(
    every: Period,
    *,
    calendar: bool,
    start_us: int,
    until_us: int | None,
    zones: ZoneHistory = (),
) -> int:
    """The end of the issue period that starts at (or, the first, contains) ``start_us``,
    for a subject whose changes of time zone are ``zones``."""
    end = calendar_window(every, start_us, zones)[1] if calendar else add_period(start_us, every)
    return end if until_us is None else min(end, until_us)


def rolled_over(amount: int, rollover_max: int, left_before: int) -> int:
    """An issue's amount: ``amount`` plus what the last issue left, up to ``rollover_max``."""
    return amount + min(rollover_max, max(left_before, 0))


def issues_due(
    every: Period,
    *,
    calendar: bool,
    amount: int,
    rollover_max: int,
    until_us: int | None,
    last: Issue,
    left_of_last: int,
    now_us: int,
    zones: ZoneHistory = (),
) -> list[Issue]:
    """The issues after ``last`` whose periods have started by ``now_us``, in order.

    ``left_of_last`` is what the last issue has left; a period no one read
    while it lasted was not drawn on, so its issue leaves all of itself.
    """
    found: list[Issue] = []
    previous, left = last, left_of_last
    while previous.end_us <= now_us and (until_us is None or previous.end_us < until_us):
        if len(found) >= MAX_ISSUES_AT_ONCE:
            break
        start = previous.end_us
        end = period_end(every, calendar=calendar, start_us=start, until_us=until_us, zones=zones)
        issue = Issue(previous.number + 1, start, end, rolled_over(amount, rollover_max, left))
        found.append(issue)
        previous, left = issue, issue.amount
    return found


def next_due_us(last: Issue, until_us: int | None) -> int | None:
    """When the issue after ``last`` is due, or None: never (``until`` is reached)."""
    if until_us is not None and last.end_us >= until_us:
        return None
    return last.end_us


def parse_low(text: object) -> tuple[int | None, int | None]:
    """``--low 20%`` or ``--low 500``: (units, percent), one of them None."""
    if isinstance(text, bool):
        raise InvalidInput("low", f"must be a number of units or a percentage, got {shown(text)}")
    if isinstance(text, int):
        return _low_units(text), None
    if not isinstance(text, str):
        raise InvalidInput("low", f"must be a number of units or a percentage, got {shown(text)}")
    stripped = text.strip()
    if stripped.endswith("%"):
        digits = stripped[:-1].strip()
        if not digits.isdigit() or len(digits) > 3 or not 1 <= int(digits) <= 100:
            raise InvalidInput("low", f"a percentage must be 1% to 100%, got {shown(text)}")
        return None, int(digits)
    if not stripped.isdigit() or len(stripped) > 16:
        raise InvalidInput(
            "low", f"must be a whole number of units or a percentage, got {shown(text)}"
        )
    return _low_units(int(stripped)), None


def _low_units(value: int) -> int:
    if not 0 <= value <= 10**15:
        raise InvalidInput("low", f"must be between 0 and 10**15 units, got {shown(value)}")
    return value


def low_threshold(amount: int, units: int | None, percent: int | None) -> int | None:
    """What left (or less) makes a grant of ``amount`` low, or None: never announced."""
    if units is not None:
        return units
    if percent is not None:
        return amount * percent // 100
    return None


__all__ = [
    "Issue",
    "issue_id",
    "issues_due",
    "low_threshold",
    "next_due_us",
    "parse_low",
    "period_end",
    "rolled_over",
]
