"""A subject's time zone, and the calendar windows it gives; instants in microseconds.

Calendar windows of whole days (``1d``; ``7d`` from Monday) and of months of a subject
with a zone (IANA, `validate_zone`) start at its local midnight: a day lasts 23 or 25
hours across a DST change; a midnight the clock skips starts at the first instant after
it. Shorter periods and those not whole days (``1h``, ``36h``) stay aligned in UTC.
A change of zone takes effect where the window it falls in ends: the next window starts
there and ends at the new zone's next boundary (a transition window), later ones follow
the new zone; windows never move, overlap or leave gaps. `ZoneHistory`: the changes,
oldest first, as (instant, zone); before the first, UTC.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, available_timezones

from metering.domain.bounds import shown
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Period
from metering.errors import InvalidInput

UTC_ZONE: Final = "UTC"
DAY_SECONDS: Final = 86_400
# 1970-01-05 was a Monday: windows of whole weeks start on Mondays.
ANCHOR_DAY: Final = date(1970, 1, 5)
ZoneHistory = tuple[tuple[int, str], ...]
Window = tuple[int, int]


@lru_cache(maxsize=1)
def known_zones() -> frozenset[str]:
    """The IANA zone names this system's time zone database holds."""
    return frozenset(available_timezones())


def validate_zone(name: object, *, field_name: str = "time_zone") -> str:
    """An IANA time zone name (``Asia/Kolkata``, ``UTC``), else `InvalidInput`."""
    if not isinstance(name, str) or name not in known_zones():
        raise InvalidInput(
            field_name, f"{shown(name)} is not an IANA time zone name like 'Europe/Berlin'"
        )
    return name


@lru_cache(maxsize=512)
def zone_of(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def follows_zone(period: Period) -> bool:
    """Whether a calendar window of ``period`` starts at local midnight (whole days, months)."""
    return period.is_calendar_months or period.seconds % DAY_SECONDS == 0


@lru_cache(maxsize=8192)  # windows of one day or month share their bounds
def local_midnight(day: date, zone: str) -> int:
    """The first instant of ``day`` in ``zone``: its midnight, the first occurrence of
    it if the clock passes it twice, or the first instant after it if a change skips it."""
    tz = zone_of(zone)
    wall = datetime.combine(day, time(), tz)
    after = to_us(wall, field_name="window")
    if from_us(after).astimezone(tz).replace(tzinfo=None) == wall.replace(tzinfo=None):
        return after
    # Skipped: ``after`` lies past the change, fold=1 before it; the change is between.
    before = to_us(wall.replace(fold=1), field_name="window")
    naive = wall.replace(tzinfo=None)
    while after - before > 1:
        middle = (before + after) // 2
        if from_us(middle).astimezone(tz).replace(tzinfo=None) >= naive:
            after = middle
        else:
            before = middle
    return after


def _local_days(period: Period, local: date) -> tuple[date, date]:
    if period.is_calendar_months:
        index = (local.year - 1970) * 12 + local.month - 1
        first = index - index % period.months
        last = first + period.months
        return (
            date(1970 + first // 12, first % 12 + 1, 1),
            date(1970 + last // 12, last % 12 + 1, 1),
        )
    days = period.seconds // DAY_SECONDS
    start = ANCHOR_DAY + timedelta(days=(local - ANCHOR_DAY).days // days * days)
    return start, start + timedelta(days=days)


def local_window(period: Period, zone: str, at_us: int) -> Window:
    """The window of ``period`` (`follows_zone`) containing ``at_us``, aligned in ``zone``."""
    local = from_us(at_us).astimezone(zone_of(zone)).date()
    first, last = _local_days(period, local)
    start, end = local_midnight(first, zone), local_midnight(last, zone)
    while end <= at_us:  # a clock set back across midnight: the next local day
        first, last = _local_days(period, last)
        start, end = end, local_midnight(last, zone)
    return start, end


def _in_regime(period: Period, zone: str, begin_us: int | None, at_us: int) -> Window:
    start, end = local_window(period, zone, at_us)
    return (start if begin_us is None else max(start, begin_us)), end


def _regime(period: Period, history: ZoneHistory, at_us: int) -> tuple[str, int | None]:
    """The zone in force for the window containing ``at_us``, and where its regime began."""
    zone, begin = UTC_ZONE, None
    pending: tuple[int, str] | None = None  # (where it takes effect, the zone)
    for since_us, name in history:
        if since_us > at_us:
            break
        if pending is not None and pending[0] <= since_us:
            (begin, zone), pending = pending, None
        end = _in_regime(period, zone, begin, since_us)[1]
        pending = None if name == zone else (end, name)
    if pending is not None and pending[0] <= at_us:
        begin, zone = pending
    return zone, begin


def zoned_window(period: Period, history: ZoneHistory, at_us: int) -> Window:
    """The calendar window of ``period`` (`follows_zone`) containing ``at_us`` for a
    subject whose zone changed as ``history`` says (see the module's docstring)."""
    zone, begin = _regime(period, history, at_us)
    return _in_regime(period, zone, begin, at_us)


def window_zone(period: Period, history: ZoneHistory, at_us: int) -> str:
    """The zone the window of ``period`` containing ``at_us`` is aligned in."""
    return _regime(period, history, at_us)[0]


def window_label(period: Period, history: ZoneHistory, window: Window) -> tuple[str, str] | None:
    """The zone a calendar window of a subject with ``history`` is aligned in, and its
    local label (`local_span`); None for a window aligned in UTC."""
    if not history or not follows_zone(period):
        return None
    zone = window_zone(period, history, window[0])
    return None if zone == UTC_ZONE else (zone, local_span(*window, zone))


def local_span(start_us: int, end_us: int, zone: str) -> str:
    """A window's local label, its zone named: ``2026-03 Europe/Berlin`` for a month,
    ``2026-03-29 Europe/Berlin`` for a day, ``2026-03-23 to 2026-03-29 ...`` for whole
    days (the last included), else both ends (`local_text`)."""
    tz = zone_of(zone)
    first, last = from_us(start_us).astimezone(tz), from_us(end_us).astimezone(tz)
    if (
        local_midnight(first.date(), zone) == start_us
        and local_midnight(last.date(), zone) == end_us
    ):
        months = (last.year - first.year) * 12 + last.month - first.month
        if first.day == last.day == 1 and months == 1:
            return f"{first:%Y-%m} {zone}"
        final = last.date() - timedelta(days=1)
        if final == first.date():
            return f"{first:%Y-%m-%d} {zone}"
        return f"{first:%Y-%m-%d} to {final:%Y-%m-%d} {zone}"
    return f"{local_text(start_us, zone)} to {local_text(end_us, zone)} {zone}"


def local_text(at_us: int, zone: str) -> str:
    """``YYYY-MM-DD HH:MM:SS±hh:mm`` in ``zone``, rounded up to the second as UTC
    instants are shown (`metering.domain.instants.clock_text`)."""
    seconds = -(-at_us // 1_000_000)
    local = from_us(seconds * 1_000_000).astimezone(zone_of(zone))
    return local.isoformat(sep=" ")
