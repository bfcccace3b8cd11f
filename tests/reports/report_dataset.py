"""A billing dataset built through the public API, and an independent model of it.

`record` records the events of `EVENTS` with `Meter.consume` (the frozen
clock set to each event's time, so the decision time is the event time), then
deletes the limit ``gone``. `expected_rows` computes what every report row
should say from the same events with a few lines of arithmetic that share
nothing with `metering`'s window or report code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from metering import FrozenClock, Limit, Meter


def at(day: str, hour: int = 12) -> datetime:
    return datetime.fromisoformat(day).replace(hour=hour, tzinfo=UTC)


LIMITS = (
    Limit("api_calls", maximum=10, period="1mo", window="calendar", enforcement="soft"),
    Limit("exports", maximum=3, period="7d"),  # first-use windows, hard
    Limit("seats", maximum=5, period="1mo", window="calendar"),  # hard
    Limit("burst", maximum=2, period="10s", algorithm="token_bucket"),
    Limit("gone", maximum=1, period="1mo", window="calendar"),
)
WEEK = timedelta(days=7)


def _events() -> list[tuple[str, str, int, datetime]]:
    events = []
    day = at("2026-10-20", 9)
    while day < at("2026-12-06"):  # org-a: 2 api calls every other day, Oct to Dec
        events.append(("org-a", "api_calls", 2, day))
        day += timedelta(days=2)
    for n in range(8):  # org-b: 8 api calls in November, under its maximum of 10
        events.append(("org-b", "api_calls", 1, at(f"2026-11-{n + 3:02d}", 15)))
    # org-a exports: a first-use window opened on Oct 30 runs into November
    # (an October window); in it, Nov 4 is denied. Then a November window
    # with two denials, and one opened in December.
    for day_text, hour, cost in [
        ("2026-10-30", 10, 1),
        ("2026-11-02", 8, 1),
        ("2026-11-03", 8, 1),
        ("2026-11-04", 8, 2),
        ("2026-11-10", 11, 2),
        ("2026-11-11", 11, 1),
        ("2026-11-12", 11, 1),
        ("2026-11-13", 11, 3),
        ("2026-11-20", 9, 1),
        ("2026-12-02", 9, 1),
    ]:
        events.append(("org-a", "exports", cost, at(day_text, hour)))
    # org-b exports: one November window, no denials.
    events += [("org-b", "exports", 1, at("2026-11-05")), ("org-b", "exports", 1, at("2026-11-06"))]
    for n in range(7):  # org-a seats: 7 of 5 in November, the last two denied
        events.append(("org-a", "seats", 1, at(f"2026-11-{n + 10:02d}", 7)))
    for n in range(4):  # org-c: 4 of 5 seats, no denial, nothing else
        events.append(("org-c", "seats", 1, at(f"2026-11-{n + 20:02d}", 7)))
    for n in range(4):  # a token bucket with denials: never reported
        events.append(("org-a", "burst", 1, at("2026-11-15", 10) + timedelta(microseconds=n)))
    events.append(("org-a", "gone", 1, at("2026-11-16")))  # its limit is deleted
    return sorted(events, key=lambda e: e[3])


EVENTS = _events()


@dataclass
class Expected:
    subject: str
    limit: str
    enforcement: str
    window_start: datetime
    window_end: datetime
    maximum: int
    used: int = 0
    denied_events: int = 0
    denied_cost: int = 0
    first_denied_at: datetime | None = None

    @property
    def overage(self) -> int:
        """Billable usage beyond the maximum: soft limits only (a hard limit's
        denials are its `denied_cost`, never overage)."""
        if self.enforcement == "soft":
            return max(self.used - self.maximum, 0)
        return 0

    def as_tuple(self) -> tuple[object, ...]:
        utilisation = round(self.used * 100 / self.maximum, 2)
        return (
            self.subject,
            self.limit,
            self.enforcement,
            self.window_start,
            self.window_end,
            self.maximum,
            self.used,
            0,  # granted: the dataset has no grants
            self.overage,
            0,  # overdraft: the dataset commits no more than it reserved
            self.denied_cost,
            self.denied_events,
            utilisation,
            self.first_denied_at,
            None,  # time_zone: the dataset's subjects have none
            None,  # local_window
        )


def _month(moment: datetime) -> tuple[datetime, datetime]:
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def expected_rows() -> list[Expected]:
    """Every windowed counter of a kept limit, computed from `EVENTS`."""
    limits = {
        limit.name: limit for limit in LIMITS if limit.name in ("api_calls", "exports", "seats")
    }
    windows: dict[tuple[str, str, datetime], Expected] = {}
    current: dict[tuple[str, str], Expected] = {}
    for subject, name, cost, when in EVENTS:
        limit = limits.get(name)
        if limit is None:
            continue
        if limit.window == "calendar":
            start, end = _month(when)
            row = windows.setdefault(
                (subject, name, start),
                Expected(subject, name, limit.enforcement, start, end, limit.maximum),
            )
        else:
            opened = current.get((subject, name))
            if opened is None or when >= opened.window_end:
                opened = Expected(
                    subject, name, limit.enforcement, when, when + WEEK, limit.maximum
                )
                current[(subject, name)] = windows[(subject, name, when)] = opened
            row = opened
        if limit.enforcement == "soft" or row.used + cost <= limit.maximum:
            row.used += cost
        else:
            row.denied_events += 1
            row.denied_cost += cost
            row.first_denied_at = row.first_denied_at or when
    return list(windows.values())


def in_range(rows: list[Expected], since: datetime, until: datetime) -> list[Expected]:
    return [row for row in rows if since <= row.window_start < until]


def by_overage(rows: list[Expected]) -> list[tuple[object, ...]]:
    ordered = sorted(
        rows,
        key=lambda r: (
            -r.overage,
            -r.denied_cost,
            -r.used / r.maximum,
            r.subject,
            r.limit,
            r.window_start,
        ),
    )
    return [row.as_tuple() for row in ordered]


def record(meter: Meter, clock: FrozenClock) -> None:
    meter.set_limits(LIMITS)
    for subject, limit, cost, when in EVENTS:
        clock.set(when)
        meter.consume(subject, limit, cost=cost, occurred_at=when)
    meter.delete_limit("gone")
