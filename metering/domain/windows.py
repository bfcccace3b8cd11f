"""Where a fixed window starts and ends; all instants are microseconds since the epoch.

``calendar`` windows are aligned in UTC (or at a subject's local midnight,
`metering.domain.zones`): periods in seconds to multiples of the period from Monday
1970-01-05 00:00 (``1h`` on the hour, ``1d`` at midnight, ``7d`` on Monday), periods in
months to calendar months (``1mo``, ``3mo`` the quarter). A ``first_use`` window opens at
a subject's first event and lasts one period; the next event after it opens the next. A
late event between two windows goes to the next when one opened at it would overlap that
one. A month-long first-use window ends on the same day of the next month, or that month's
last day (Jan 31 -> Feb 28). `gauge_level`: a gauge's level; `evaluate_window` judges it.
"""

from __future__ import annotations

import calendar
from dataclasses import replace
from typing import Final

from metering.domain.grants import Pot, WindowFit, fit_window
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit, Period
from metering.domain.pacing import ahead_of_pace, paced_maximum, paced_retry_us
from metering.domain.state import CounterState, Evaluation
from metering.domain.zones import ZoneHistory, follows_zone, zoned_window

# 1970-01-05 was a Monday: weekly calendar windows start on Mondays.
CALENDAR_ANCHOR_US: Final = 4 * 86_400 * 1_000_000
Window = tuple[int, int]


def add_period(start_us: int, period: Period) -> int:
    """The instant one period after ``start_us``."""
    if not period.is_calendar_months:
        return start_us + period.seconds * 1_000_000
    start = from_us(start_us)
    month_index = start.year * 12 + (start.month - 1) + period.months
    year, month = divmod(month_index, 12)
    month += 1
    day = min(start.day, calendar.monthrange(year, month)[1])
    return to_us(start.replace(year=year, month=month, day=day))


# The last UTC window of months worked out per period: most events fall in it,
# and finding it again takes two comparisons instead of date arithmetic.
_LAST_MONTHS: dict[Period, Window] = {}


def calendar_window(period: Period, at_us: int, zones: ZoneHistory = ()) -> Window:
    """The calendar window containing ``at_us``: aligned in UTC, or for a subject
    with a time zone (``zones``: its changes of zone) at its local midnights."""
    if zones and follows_zone(period):
        return zoned_window(period, zones, at_us)
    if not period.is_calendar_months:
        size = period.seconds * 1_000_000
        start = at_us - (at_us - CALENDAR_ANCHOR_US) % size
        return start, start + size
    last = _LAST_MONTHS.get(period)
    if last is not None and last[0] <= at_us < last[1]:
        return last
    window = _LAST_MONTHS[period] = _months_window(period, at_us)
    return window


def _months_window(period: Period, at_us: int) -> Window:
    """The UTC window of ``period`` (whole months) containing ``at_us``."""
    moment = from_us(at_us)
    month_index = (moment.year - 1970) * 12 + (moment.month - 1)
    first = month_index - month_index % period.months
    year, month0 = divmod(first, 12)
    start = to_us(
        moment.replace(
            year=1970 + year, month=month0 + 1, day=1, hour=0, minute=0, second=0, microsecond=0
        )
    )
    return start, add_period(start, period)


def first_use_window(
    period: Period, at_us: int, latest_before: Window | None, following: Window | None
) -> Window:
    """The first-use window an event at ``at_us`` is charged to.

    ``latest_before`` is the subject's latest window that starts at or before
    ``at_us``; ``following`` its earliest window that starts after ``at_us``
    (only late events have one). An event outside ``latest_before`` opens a
    window of one whole period, unless that would overlap ``following``: then
    it is charged to ``following``. So windows never overlap, and a gap
    between two windows never holds a maximum of its own.
    """
    if latest_before is not None and latest_before[0] <= at_us < latest_before[1]:
        return latest_before
    end = add_period(at_us, period)
    if following is not None and following[0] < end:
        return following
    return at_us, end


def gauge_level(
    aggregation: str, used: int, level_at_us: int | None, value: int, at_us: int
) -> tuple[int, int | None]:
    """A gauge window's (level, instant of the level) after an allowed report
    of ``value`` at ``at_us``, from its ``used`` and the instant
    ``level_at_us`` of that level (a ``latest`` gauge keeps it in the
    counter's ``tat_us``; None: no level yet).

    ``max`` keeps the peak. ``latest`` takes the report unless it is older
    than the level it would replace (a late report does not undo a newer
    one; at the same instant the later decision wins).
    """
    if aggregation == "max":
        return max(used, value), None
    if level_at_us is None or at_us >= level_at_us:
        return value, at_us
    return used, level_at_us


def _evaluate_gauge(
    limit: Limit, state: CounterState, value: int, window: Window, now_us: int
) -> Evaluation:
    """A gauge's report: hard and shadow fit iff ``value <= maximum``, soft
    always; used becomes the level (`gauge_level`). Only soft bills overage."""
    maximum = limit.maximum
    soft = limit.enforcement == "soft"
    fits = soft or value <= maximum
    level, level_at = gauge_level(limit.aggregation, state.used, state.tat_us, value, now_us)
    return Evaluation(
        fits=fits,
        applied=replace(state, used=level, tat_us=level_at),
        denied=state.with_denial(value, now_us),
        used_before=state.used,
        used_after=level,
        remaining_before=max(maximum - state.used, 0),
        remaining_after=max(maximum - level, 0),
        resets_at_us=window[1],
        resets_at_before_us=window[1],
        retry_at_us=None,  # a level above the maximum fits in no window
        overage_after=max(level - maximum, 0) if soft else 0,
        overage_before=max(state.used - maximum, 0),
    )


def evaluate_window(
    limit: Limit,
    state: CounterState,
    cost: int,
    window: Window,
    now_us: int,
    pot: Pot | None = None,
) -> Evaluation:
    """A fixed-window charge: hard fits iff ``used + cost <= maximum``; soft always fits.

    With grants (``pot``), the charge may also draw on them: see `grants.fit_window`.
    A cost of 0 (a seat already held, `metering.domain.distinct`) always fits,
    even where a lowered maximum is below ``used``, and adds no overage. A
    paced limit's own allowance is its pace (`metering.domain.pacing`).
    """
    if limit.aggregation != "sum":
        return _evaluate_gauge(limit, state, cost, window, now_us)
    used_after = state.used + cost
    soft = limit.enforcement == "soft"
    end_us = window[1]
    # A paced hard or shadow window has room up to its pace; overage is
    # still counted against the maximum.
    paced = limit.pacing and not soft
    room = paced_maximum(limit.maximum, limit.burst or 0, window, now_us) if paced else None
    allowance = limit.maximum if room is None else room
    if pot is None:
        own_used, drawn_now = state.used, 0
        fit = WindowFit(
            fits=used_after <= allowance,
            draws=(),
            remaining_before=max(allowance - state.used, 0),
            remaining_after=max(allowance - used_after, 0),
            overage_after=max(used_after - limit.maximum, 0),
            overage_before=max(state.used - limit.maximum, 0),
        )
    else:
        granted = pot.granted.get(window[0], 0)
        own_used, drawn_now = state.used - granted, pot.available(now_us)
        fit = fit_window(allowance, state.used, granted, cost, pot, now_us, soft=soft)
        if room is not None:
            own_after = own_used + cost - sum(amount for _, amount in fit.draws)
            fit = replace(
                fit,
                overage_after=max(own_after - limit.maximum, 0),
                overage_before=max(own_used - limit.maximum, 0),
            )
    free = cost == 0
    fits = soft or fit.fits or free
    retry = None
    if not fits and room is not None:
        wanted = own_used + cost - drawn_now
        retry = paced_retry_us(limit.maximum, limit.burst or 0, window, wanted, now_us)
    if not fits and retry is None:
        # Next window: its own allowance again, and the grants still active then.
        extra = 0 if pot is None else pot.available(end_us)
        retry = end_us if cost <= limit.maximum + extra else None
    ahead = (
        limit.pacing
        and soft
        and ahead_of_pace(
            limit.maximum, limit.burst or 0, window, used_after - (state.used - own_used), now_us
        )
    )
    return Evaluation(
        fits=fits,
        applied=state.with_used(used_after),
        denied=state.with_denial(cost, now_us),
        used_before=state.used,
        used_after=used_after,
        remaining_before=fit.remaining_before,
        remaining_after=fit.remaining_after,
        resets_at_us=end_us,
        resets_at_before_us=end_us,
        retry_at_us=retry,
        overage_after=0 if free else fit.overage_after,
        overage_before=fit.overage_before,
        draws=fit.draws,
        ahead_of_pace=bool(ahead) and not free,
    )
