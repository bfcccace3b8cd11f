"""A subject's time zone, and the calendar windows it gives; instants in microseconds.

Whole-day windows (``1d``; ``7d`` from Monday) and months of a subject with a zone (IANA,
`validate_zone`) start at its local midnight: a day lasts 23 or 25 hours across DST; a
skipped midnight starts at the first instant after it. Other periods (``1h``, ``36h``)
stay aligned in UTC. A change of zone takes effect where the window it falls in ends:
the next window ends at the new zone's next boundary, later ones follow the new zone;
windows never move, overlap or leave gaps. `ZoneHistory`: the changes, oldest first, as
(instant, zone); before the first, UTC. `billing_month`: the local month a window's
start falls in.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, available_timezones

from metering.domain.bounds import shown
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Period, parse_period
from metering.errors import InvalidInput

UTC_ZONE: Final = "UTC"
DAY_SECONDS: Final = 86_400
# 1970-01-05 was a Monday: windows of whole weeks start on Mondays.
ANCHOR_DAY: Final = date(1970, 1, 5)
ZoneHistory = tuple[tuple[int, str], ...]
Window = tuple[int, int]
MONTH: Final = parse_period("1mo")


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


def zone_before(history: ZoneHistory, at_us: int) -> str:
    """The zone of the last change strictly before ``at_us`` (UTC before the first).
    For a calendar window starting at ``at_us`` this is the zone it is aligned in
    (`window_zone`): a change takes effect only where the window it falls in ends."""
    zone = UTC_ZONE
    for since_us, name in history:
        if since_us >= at_us:
            break
        zone = name
    return zone


@lru_cache(maxsize=8192)  # the counters a window's start makes share it
def billing_month(history: ZoneHistory, start_us: int) -> str:
    """The billing month (``2026-11``) of a subject's window starting at ``start_us``:
    the month of its start in the subject's zone then (`zone_before`), whatever the
    window's kind; UTC's for a subject without one."""
    zone = zone_before(history, start_us) if history else UTC_ZONE
    return f"{from_us(start_us).astimezone(zone_of(zone)):%Y-%m}"


def month_bounds(history: ZoneHistory, year: int, month: int) -> tuple[int, int, str]:
    """The instants of a subject's billing month ``year-month`` and the zone it is
    aligned in: from the start of its first monthly calendar window (`zoned_window`)
    whose `billing_month` is ``year-month`` to the end of its last (a change of zone
    may put a short window beside the month's own), so each instant is in one
    billing month; the zone is the one of the window holding the 15th."""
    middle = to_us(datetime(year, month, 15, 12, tzinfo=UTC), field_name="period")
    zone, begin = _regime(MONTH, history, middle)
    start, end = _in_regime(MONTH, zone, begin, middle)
    day = DAY_SECONDS * 1_000_000
    if not any(start - 40 * day < since <= end for since, _ in history):
        return start, end, zone  # no change near: the month is this window alone
    label = f"{year:04d}-{month:02d}"
    # A window billed in the month starts within a day of the month in UTC.
    at = to_us(datetime(year, month, 1, tzinfo=UTC), field_name="period") - day
    after = to_us(datetime(year, month, 28, tzinfo=UTC), field_name="period") + 5 * day
    found: list[Window] = []
    while at < after:
        first, last = zoned_window(MONTH, history, at)
        if billing_month(history, first) == label:
            found.append((first, last))
        at = last
    return found[0][0], found[-1][1], zone


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
