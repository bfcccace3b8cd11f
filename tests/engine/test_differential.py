"""Every production path decides as the reference engine does, on SQLite and PostgreSQL.

The paths (`metering.engine.paths`): "one_trip", PostgreSQL's function
for a single event (`metering.engine.one_trip`; what it declines takes the
fast path); "direct", the fast path on the engine's own connections
(stdlib sqlite3, psycopg); "connection", the fast path on a SQLAlchemy
connection. The oracle is "reference" (`metering.engine.reference`).
`on_path`, `apply_on` and `reserve_on` are the only code that forces a path.

Hypothesis drives a path and the oracle, each on its own database, with
the same stream of batches (one event at a time on "one_trip", and in
batches marked ``singly`` elsewhere): hard, soft and shadow limits,
calendar and first-use windows (one of months), token buckets, thresholds
in percent and in units, dimensions, stacked charges, money (priced limits
and spend limits of three currencies, tiered prices and flat fees, price
changes effective in the past, now and later, prices removed, amounts past
the bound), seats
(``distinct="user"``: new values, repeats, missing and empty values, cost
2), gauges (peak and last level, hard, soft and shadow, levels of 0),
paced limits (hard, soft and shadow; bursts in units and percent),
runaway breakers (hard and soft, with grants and entitlements, tripped and
holding their quarantine maximum), forecast leads (``limit.forecast``, and
thresholds told their forecast), a
limit's maximum changed, entitlements (some effective in the past),
grants (expiring, with priorities and ``low``) and recurring grants,
subjects' own thresholds, subjects' time zones (Kathmandu and Santiago from
the start, changes near a day's and a month's end), voids and resets
between batches (every other batch's changes made by a second meter on the
path's database, as another process would, with a cache of its own),
late events (some past their lateness), events from the future (some accepted),
repeated ids (duplicates and conflicts), unknown limits, invalid events
raised (``invalid="raise"``) or rejected; and, where the path holds them,
reservations reserved, cancelled and committed (at an actual cost). Every
answer (kind and outcome, or the error; reservations and voids in full),
what the metrics count, and every table a decision writes
(`differential.stored`) must be identical, and a full audit of each
database find nothing. The "direct" and "connection" runs also ask `check`
both ways after each batch: the same `Decision` or error. A second run
imports some batches (``enforce`` and ``allow_late`` each way) on the
direct path.

Each run also asserts the path decided: the reference engine decides
only what the fast path leaves to it by design (an event before its
subject's current first-use window; for a reservation also seats and gauges,
refused there), counted by the need declined; notices, forecasts and
breakers are decided on every path (only SQLite's dead letters leave the
direct connections); the one-trip function is tried for
every event, never errs, and decides many; a `check` is the fast path's
unless it raises, a recurring grant may be due, or it falls before a
current first-use window. What no stream reaches (processes racing, round
trips) is in ``test_paths.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from budgets import examples
from differential import (
    SETTINGS,
    answer,
    databases,
    kind,
    prepared,
    rates,
    reference_events,
    stored,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.domain.audit import Invariant
from metering.domain.decisions import ROW_FIELDS
from metering.domain.events import FUTURE_TOLERANCE_US, EventRecord, UsageEvent, make_event
from metering.domain.imports import ImportPolicy
from metering.domain.money import price_at
from metering.domain.needs import Need
from metering.engine import core, fast, paths
from metering.engine.answers import Answer, Batch, Declined
from metering.engine.one_trip import STATS
from metering.reservations import transactions
from metering.storage.tables import current_windows, grant_schedules
from metering.upkeep.audit import run_audit

START = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # an hour's, a day's and a month's end near
LIMITS = [
    # What the one-trip function decides alone (unpriced, no seats).
    Limit("cal", maximum=8, period="1h", window="calendar", thresholds=(50, 100)),
    Limit("fu", maximum=6, period="30m", dimensions=("route", "model")),
    Limit("bucket", maximum=4, period="10s", algorithm="token_bucket", thresholds=(100,)),
    Limit("shadow", maximum=3, period="20m", enforcement="shadow"),
    Limit("units", maximum=9, period="30m", thresholds_units=(3, 7)),
    Limit("day", maximum=7, period="1d", window="calendar"),  # a zoned subject's local day
    # Priced from the start (`FIRST_PRICES`), rolled up by dimensions, months.
    # (With forecast leads: `limit.forecast`, and thresholds told theirs.)
    Limit(
        "soft",
        maximum=6,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(80,),
        dimensions=("route", "model"),
        forecast_lead="1h",
    ),
    Limit("month", maximum=5, period="1mo", forecast_lead="1h"),
    Limit("dims", maximum=3, period="1h", window="calendar", dimensions=("route",)),
    # Seats.
    Limit("seats", maximum=2, period="1h", window="calendar", distinct="user"),
    Limit("fu_seats", maximum=2, period="30m", distinct="user"),
    Limit(
        "soft_seats",
        maximum=2,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(50, 100),
        distinct="user",
        dimensions=("route",),
    ),
    Limit(
        "shadow_seats",
        maximum=1,
        period="1h",
        window="calendar",
        enforcement="shadow",
        distinct="user",
    ),
    # Spend limits of three currencies (JPY has no minor unit).
    spend_limit(
        "usd_day",
        "0.30",
        "USD",
        "1d",
        window="calendar",
        thresholds=(50, 100),
        dimensions=("route",),
    ),
    spend_limit("usd_soft", "0.10", "USD", "1h", enforcement="soft", thresholds=(80,)),
    spend_limit("eur_fu", "0.20", "EUR", "2h"),
    spend_limit("jpy_shadow", "30", "JPY", "1h", window="calendar", enforcement="shadow"),
    # Paced: a window's maximum spread over it, plus a burst.
    Limit("paced", maximum=6, period="1h", window="calendar", pacing=True, burst=1),
    Limit(
        "paced_soft",
        maximum=8,
        period="30m",
        enforcement="soft",
        pacing=True,
        burst="25%",
        thresholds=(50,),
    ),
    Limit("paced_shadow", maximum=4, period="1h", enforcement="shadow", pacing=True, burst=0),
    # (A zoned subject's day, paced: what the one-trip function decides often.)
    Limit("paced_day", maximum=40, period="1d", window="calendar", pacing=True, burst="10%"),
    # Runaway breakers: past 2 (3) x their baseline for a minute: any use, minutes apart.
    Limit(
        "breaker",
        maximum=40,
        period="1h",
        window="calendar",
        thresholds=(50,),
        breaker="2x",
        breaker_floor=0.000001,
        quarantine_max=2,
    ),
    Limit(
        "breaker_soft",
        maximum=30,
        period="30m",
        enforcement="soft",
        breaker="3x",
        breaker_floor=0.000001,
    ),
    # Gauges: the peak and the last level (a cost is the level, 0 included).
    Limit(
        "peak",
        maximum=6,
        period="1h",
        window="calendar",
        aggregation="max",
        thresholds=(50, 100),
    ),
    Limit("level", maximum=4, period="30m", aggregation="latest", enforcement="soft"),
    Limit(
        "shadow_level",
        maximum=3,
        period="1h",
        window="calendar",
        aggregation="latest",
        enforcement="shadow",
        thresholds_units=(2,),
    ),
]
SUITED = ["cal", "fu", "bucket", "shadow", "units"]
OTHER = ["soft", "month", "dims", "day", "paced_day"]
SEATS = ["seats", "fu_seats", "soft_seats", "shadow_seats"]
GAUGES = ["peak", "level", "shadow_level"]
PACED = ["paced", "paced_soft", "paced_shadow"]
BREAKERS = ["breaker", "breaker_soft"]
NAMES = [
    *[*SUITED, *SUITED, *SUITED, *SUITED, *OTHER, *SEATS, *GAUGES, *GAUGES, *PACED, *BREAKERS],
    *["usd_day", "unknown"],
]
# (A grant on a gauge is refused, by both alike.)
GRANTABLE = [
    *["cal", "fu", "soft", "shadow", "units", "seats", "usd_day", "eur_fu", "peak"],
    *["paced", "paced_soft", "breaker"],
]
OWN = [
    *["cal", "fu", "bucket", "units", "seats", "fu_seats", "usd_day", "eur_fu", "peak", "level"],
    *["paced", "paced_soft", "breaker"],
]
# Grants and own thresholds (the function declines their pairs) for two subjects.
HOLDERS = ["org-2", "user-é"]
PRICED = ["soft", "month", "dims", "bucket"]
# Priced from the start (the others by the streams' price changes).
FIRST_PRICES: list[tuple[str, Any, str]] = [
    *[("soft", "0.01", "USD"), ("month", "0.0049", "EUR"), ("dims", "20000", "JPY")],
    # Tiers and flat fees where the one-trip function decides them (spend caps
    # without thresholds).
    ("fu", {"model": "graduated", "tiers": ["3:0.004", "inf:0.0015"]}, "EUR"),
    ("cal", {"model": "volume", "tiers": ["2:0.8", "5:0.5", "inf:0.3"], "flat_fee": "1"}, "JPY"),
    ("units", {"model": "package", "package": 3, "per_package": "0.01"}, "EUR"),
]
SUBJECTS = ["org-1", "org-2", "user-é"]
# Subjects' zones: the windows of days and months of `ZONED` are theirs.
ZONED = ["soft", "soft_seats", "usd_day", "day", "paced_day"]
FIRST_ZONES = [("org-2", "Asia/Kathmandu"), ("user-é", "America/Santiago")]  # in force at START
# Changed before the stream's second and third batches: from where the windows end.
ZONE_CHANGES = {1: [("org-1", "Europe/Berlin")], 2: [("org-2", "UTC"), ("user-é", "Asia/Kolkata")]}
DAY_US = 86_400_000_000
# Quarantines released before the stream's second and third batches (a
# second release of one is an error, on both alike).
RELEASES = {1: [("org-1", "breaker")], 2: [("org-2", "breaker_soft"), ("org-1", "breaker")]}
METADATA = [
    None,
    {"route": "/a"},
    {"route": "/b", "model": 2},
    {"user": "a"},
    {"user": "b", "route": "/a"},
    {"user": 7},  # the value "7"
    {"user": "7", "route": "/b"},
    {"user": ""},  # not a value: rejected on a seat limit
]
# Tiered prices: each priced by its window's total before the event.
TIERED: list[dict[str, Any]] = [
    {"model": "graduated", "tiers": ["3:0.01", "inf:0.004"]},
    {"model": "volume", "tiers": ["4:0.02", "10:0.01", "inf:0.003"], "flat_fee": "0"},
    {"model": "package", "package": 3, "per_package": "0.05"},
    {"model": "graduated", "tiers": ["inf:0.01"], "flat_fee": "1"},
]
BIG = 10**12  # the largest cost: past every spend limit's bound once priced

charge = st.tuples(
    st.sampled_from(SUBJECTS),
    st.sampled_from(NAMES),
    # 0: a gauge's level, refused elsewhere; 2 and more: refused on a seat limit.
    st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4, 5, 7, BIG]),
)
charges = st.one_of(
    st.lists(charge, min_size=1, max_size=1),
    st.lists(charge, min_size=1, max_size=3, unique_by=lambda c: c[:2]),
)
# 240 s ahead is accepted (a first-use window may start after now), 600 s is not;
# -90,000 is past every limit's lateness (a day).
OFFSETS = [0, 0, 0, 0, 0, 0, -30, -700, -1900, -4000, -90_000, 240, 600]
event = st.fixed_dictionaries(
    {
        "id": st.integers(0, 30),  # small: ids repeat across and inside batches
        "charges": charges,
        "offset_seconds": st.sampled_from(OFFSETS),
        "metadata": st.sampled_from(METADATA),
        # Applied one at a time: the clock moves before each, and each has its policy.
        "advance_seconds": st.sampled_from([0, 0, 1, 7, 61, 700]),
        "invalid": st.sampled_from(["reject", "reject", "raise"]),
    }
)
reservation = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["reserve", "reserve", "cancel", "commit"]),
        "id": st.integers(0, 30),
        "charges": charges,
        "offset_seconds": st.sampled_from([0, 0, -30, -1900]),
        "metadata": st.sampled_from(METADATA),
        "ttl_seconds": st.sampled_from([1, 60, 3600]),
        "actual": st.one_of(st.none(), st.integers(0, 5)),
    }
)
batch = st.fixed_dictionaries(
    {
        "advance_seconds": st.sampled_from([0, 20, 61, 900, 1900, 3600]),
        "singly": st.booleans(),
        "invalid": st.sampled_from(["reject", "reject", "raise"]),
        "events": st.lists(event, min_size=1, max_size=8),
        "limit_change": st.one_of(
            st.none(), st.tuples(st.sampled_from(["cal", "seats"]), st.integers(1, 8))
        ),
        "entitlements": st.lists(
            st.tuples(
                st.sampled_from(SUBJECTS),
                st.sampled_from(OWN),
                st.one_of(st.none(), st.integers(1, 9)),
                st.sampled_from([0, -600, -3000]),  # effective from: now, or earlier
            ),
            max_size=2,
        ),
        "grants": st.lists(
            st.tuples(
                st.sampled_from(HOLDERS),
                st.sampled_from(GRANTABLE),
                st.integers(1, 5),
                st.sampled_from([None, 60, 1000, 5000]),  # expires after: never, or seconds
                st.sampled_from([50, 100, 150]),  # priority
                st.sampled_from([None, None, 1, "50%"]),  # grant.low at
                st.sampled_from([None, None, "1h"]),  # recurring (then no expiry)
            ),
            max_size=1,
        ),
        "alerts": st.lists(
            st.tuples(
                st.sampled_from(HOLDERS),
                st.sampled_from([*OWN, "soft"]),
                st.sampled_from([["50%"], ["1", "90%"]]),
            ),
            max_size=1,
        ),
        "prices": st.lists(
            st.tuples(
                st.sampled_from(PRICED),
                # None: removed; a dict: a tiered price (or a flat fee).
                st.sampled_from(["0.002", "0.015", "0.125", "1", "5000", None, *TIERED, *TIERED]),
                st.sampled_from(["USD", "USD", "EUR", "JPY"]),
                st.sampled_from([0, -600, -2400, 900]),  # effective from: now, earlier, later
            ),
            max_size=1,
        ),
        "voids": st.lists(st.integers(0, 30), max_size=1),
        "reset": st.one_of(
            st.none(),
            st.none(),
            st.none(),
            st.tuples(
                st.sampled_from([None, *SUBJECTS]),
                st.sampled_from([None, "cal", "fu", "seats", "usd_day", "peak", "level"]),
            ),
        ),
        "reservations": st.lists(reservation, max_size=2),
    }
)
streams = st.lists(batch, min_size=1, max_size=5)


def _batch(first: int, events: list[tuple[str, str, int, Any]], **changes: Any) -> dict[str, Any]:
    """A stream's batch of ``events`` (subject, limit, cost, metadata), each
    at the clock, their ids from ``first`` on, with ``changes`` and no other."""
    once = {"offset_seconds": 0, "advance_seconds": 0, "invalid": "reject"}
    made = [
        {"id": n, "charges": [(subject, limit, cost)], "metadata": metadata, **once}
        for n, (subject, limit, cost, metadata) in enumerate(events, first)
    ]
    lists = ["entitlements", "grants", "alerts", "prices", "voids", "reservations"]
    return {
        "advance_seconds": 0,
        "singly": True,
        "invalid": "reject",
        "events": made,
        "limit_change": None,
        "reset": None,
        **{key: [] for key in lists},
        **changes,
    }


def _rare() -> list[dict[str, Any]]:
    """A stream with what the coverage checks count, which the generated
    streams draw by chance: a second charge of `paced` at one instant (the
    pace denies it), a gauge's level, a zoned subject's day, dimensions, a
    breaker, and an event priced by each model of `TIERED`. Every run holds
    it, whatever the seed; the generated examples add the rest."""
    first = _batch(
        0,
        [
            ("org-1", "paced", 2, None),
            ("org-1", "paced", 2, None),
            ("org-2", "level", 3, None),
            ("user-é", "day", 1, None),
            ("org-1", "dims", 1, {"route": "/a"}),
            ("org-2", "breaker", 1, None),
        ],
    )
    priced = [
        _batch(n, [(subject, "dims", 1, {"route": "/b"})], prices=[("dims", tiered, "USD", 0)])
        for n, subject, tiered in zip(range(10, 14), [*SUBJECTS, "org-1"], TIERED, strict=True)
    ]
    return [first, *priced]


# Each batch's import flags, if it is an import (`metering.domain.imports`).
policy = st.sampled_from(
    [None, *(ImportPolicy(e, late) for e in (False, True) for late in (False, True))]
)
policies = st.lists(st.one_of(st.none(), policy), min_size=5, max_size=5)
# Checks charge the breaker limits often: every subject's trips at START.
guarded = st.tuples(
    st.sampled_from(SUBJECTS), st.sampled_from(BREAKERS), st.sampled_from([1, 2, 7, BIG])
)
checks = st.lists(
    st.fixed_dictionaries(
        {
            "charges": st.one_of(
                charges,
                st.lists(guarded, min_size=1, max_size=2, unique_by=lambda c: c[:2]),
                st.tuples(charge, guarded).map(list).filter(lambda c: c[0][:2] != c[1][:2]),
            ),
            "offset_seconds": st.sampled_from([0, 0, -700, -4000, 240, 600]),
            "metadata": st.sampled_from(METADATA),
        }
    ),
    max_size=4,
)


# The needs the one-trip function declares lately: the one-trip run asserts it decided each.
FUNCTION_NEEDS = {Need.TIME_ZONE, Need.DIMENSIONS, Need.PACING, Need.GAUGE, Need.BREAKER}
# Prices by the window's total it decides (`Need.MONEY`): each model, and flat fees.
FUNCTION_PRICES = ("graduated", "volume", "package", "flat fee")

# -- forcing a path: the only code that knows how ---------------------------------

ORACLE = "reference"


# Each path with those after it that may decide what it declines: the fast
# path on the engine's own connections leaves SQLite's dead letters to the
# one on SQLAlchemy's, every path leaves what is rare to the reference engine.
_PATHS = {
    "one_trip": ("one_trip", "direct", "connection", ORACLE),
    "direct": ("direct", "connection", ORACLE),
    "connection": ("connection", ORACLE),
    ORACLE: (ORACLE,),
}


def on_path(path: str, meter: Meter) -> Meter:
    """``meter`` made to decide by ``path`` ("one_trip", "direct",
    "connection", or `ORACLE`, which also settles under SQLAlchemy)."""
    engine = meter._engine
    engine.paths = [engine.path(name) for name in _PATHS[path]]
    if path in ("connection", ORACLE) and engine.direct is not None:
        engine.direct.close()
        engine.direct = None
    return meter


def apply_on(
    path: str,
    meter: Meter,
    records: Sequence[EventRecord],
    invalid: Any,
    policy: ImportPolicy | None = None,
) -> list[Answer]:
    """``records`` applied by ``path`` (``meter`` came from `on_path`), as an
    import with ``policy``'s flags if given."""
    return meter._engine.apply(records, invalid=invalid, policy=policy)


def reserve_on(path: str, meter: Meter, event: UsageEvent, ttl_us: int) -> object:
    """``event`` reserved by ``path`` (the fast path's, on "one_trip" too)."""
    return transactions.reserve(meter._engine, event, ttl_us)


# -- what the path left to the reference engine -----------------------------------

# What the fast path may decline: an event before its window (to the
# reference engine), dead letters on its own SQLite connections (to
# SQLAlchemy's), and stale limits (asked again); notices, forecasts and
# breakers it decides on every connection; a reservation also declines seats
# and gauges (refused there).
DECLINED = {Need.EARLY_FIRST_USE, Need.DEAD_LETTERS, None}
HELD = {*DECLINED, Need.HELD_SEATS, Need.HELD_GAUGE}
# What `check_record` leaves to the reference engine: an error to raise, a
# recurring grant's issue to make, an event before its window (breakers it reads).
CHECK_DECLINED = {Need.INVALID, Need.RECURRING, Need.EARLY_FIRST_USE}


class _Watch:
    """What one call of a path did: what the fast path declined (the needs
    it found), what the metrics counted (`core.count_events`), and the checks
    `check_record` left to the reference engine; each patched where the
    engine looks it up (`metering.engine.paths`, `metering.engine.core`)."""

    def __init__(self) -> None:
        self.reasons: list[Need | None] = []
        self.first_use = False
        self.counted: list[tuple[object, ...]] = []
        self.checks_left: list[Need | None] = []

    @contextmanager
    def active(self) -> Iterator[None]:
        apply_records, check_record = paths.apply_records, paths.check_record

        def applying(*args: Any, **kwargs: Any) -> Any:
            found = apply_records(*args, **kwargs)
            if isinstance(found, Declined):
                self.reasons.append(found.need)
            return found

        def checking(*args: Any) -> Any:
            found = check_record(*args)
            if isinstance(found, Declined) and not found.stale:
                self.checks_left.append(found.need)
            return found

        def watched(kind: type[Any]) -> Callable[[Any, Batch], Any]:
            # What the path answers, not what it tried: the fast path's
            # speculation on cached rows may decline, then decide with a read.
            apply = kind.apply

            def path_apply(path: Any, batch: Batch) -> Any:
                found = apply(path, batch)
                if isinstance(found, Declined) and found.need == Need.EARLY_FIRST_USE:
                    self.first_use = True  # the reference engine decides it next
                return found

            return path_apply

        with pytest.MonkeyPatch.context() as patch:
            for kind in (paths.OneTrip, paths.Direct, paths.OnConnection):
                patch.setattr(kind, "apply", watched(kind))
            patch.setattr(paths, "apply_records", applying)
            patch.setattr(paths, "check_record", checking)
            patch.setattr(core, "count_events", self.count)
            yield

    def count(self, *args: Any) -> None:
        self.counted.append(tuple(dict(a) if isinstance(a, dict) else a for a in args))


# -- one run -------------------------------------------------------------------------


def _both(meters: tuple[Meter, Meter], method: str, *args: Any, **kwargs: Any) -> None:
    """A change made on both databases (by the same SQLAlchemy code): the same answer."""
    tested, oracle = (answer(partial(getattr(m, method), *args, **kwargs)) for m in meters)
    assert tested == oracle, (method, args)


def _changes(meters: tuple[Meter, Meter], spec: dict[str, Any], number: int) -> None:
    now = meters[0].clock()
    if spec["limit_change"] is not None:
        name, maximum = spec["limit_change"]
        changed = Limit(
            name,
            maximum=maximum,
            period="1h",
            window="calendar",
            distinct="user" if name == "seats" else None,
        )
        _both(meters, "set_limit", changed)
    for subject, limit, maximum, offset in spec["entitlements"]:
        when = now + timedelta(seconds=offset)
        _both(meters, "set_entitlement", subject, limit, maximum, when)
    for index, (subject, limit, amount, expires, priority, low, every) in enumerate(spec["grants"]):
        expires_at = None if expires is None or every else now + timedelta(seconds=expires)
        options = {
            "priority": priority,
            "low": low,
            "every": every,
            "grant_id": f"g-{number}-{index}",
        }
        _both(meters, "grant", subject, limit, amount, expires_at, **options)
    for subject, limit, at in spec["alerts"]:
        _both(meters, "set_alert", subject, limit, at)
    for limit, per_unit, currency, offset in spec["prices"]:
        when = now + timedelta(seconds=offset)
        if per_unit is None:
            _both(meters, "remove_price", limit, currency, when)
        elif isinstance(per_unit, dict):
            _both(meters, "set_price", limit, None, currency, when, **per_unit)
        else:
            _both(meters, "set_price", limit, per_unit, currency, when)
    for subject, zone in ZONE_CHANGES.get(number, ()):  # (drawn from nothing: the streams stay)
        _both(meters, "set_time_zone", subject, zone)
    for subject, limit in RELEASES.get(number, ()):  # (so are these)
        _both(meters, "release_quarantine", subject, limit)
    if spec["reset"] is not None:
        subject, limit = spec["reset"]
        _both(meters, "reset", subject, limit)
    for index, event_id in enumerate(spec["voids"]):
        cid = f"c-{number}-{index}"
        _both(meters, "void", f"ev-{event_id}", "test", correction_id=cid)


def _decide(
    path: str,
    meters: tuple[Meter, Meter],
    records: list[EventRecord],
    invalid: str,
    tally: Counter[str],
    policy: ImportPolicy | None = None,
) -> None:
    """``records`` applied by the path and by the oracle: the same answers and counts."""
    tested, oracle = meters
    watch = _Watch()
    left, tried = reference_events(), STATS.copy()
    with watch.active():
        found = answer(partial(apply_on, path, tested, records, invalid, policy))
    left = reference_events() - left
    expected = answer(partial(apply_on, ORACLE, oracle, records, invalid, policy))
    assert kind(found) == kind(expected), (records, invalid)
    if not isinstance(expected, tuple):  # what the metrics would count of the oracle's answers
        counted = _Watch()
        with counted.active():
            known = tested._engine.limits.current[1]
            core._count(records, expected, known, invalid, 0)  # type: ignore[arg-type]
        assert watch.counted == counted.counted
    # The path decided: the reference engine only what the fast path leaves it.
    assert set(watch.reasons) <= DECLINED, watch.reasons
    # (An unacceptable event raised by the reference engine is not counted.)
    fell_back = len(records) if watch.first_use and not isinstance(found, tuple) else 0
    assert left == fell_back, (left, watch.reasons, found)
    tally["fell back"] += fell_back
    tally["events"] += len(records)
    if path == "one_trip":
        tried = STATS - tried
        engine = tested._engine
        needs = engine.needs(Batch(records, 0, policy=policy))
        if needs <= engine.path("one_trip").implements:
            assert tried.total() >= 1, "the one-trip function was not tried"
            if tried["applied"]:  # what the function decided, by need it now declares
                tally.update(f"function: {need}" for need in needs & FUNCTION_NEEDS)
                tally.update(f"function: {kind}" for kind in _counted(tested, records[0]))
        else:
            tally["not for the function"] += 1
        assert not tried["declined:error"], records
        tally.update(tried)


def _counted(meter: Meter, record: EventRecord) -> set[str]:
    """The models of ``record``'s prices by the window's total, and "flat fee"."""
    found = set()
    prices = meter._engine.limits.pricing.book.prices
    for _, limit, _ in record.charges:
        price = price_at(prices.get(limit, ()), record.occurred_at_us)
        if price is not None and price.counted:
            found.add(price.model)
            if price.flat_fee:
                found.add("flat fee")
    return found


def _reservations(
    path: str, meters: tuple[Meter, Meter], spec: dict[str, Any], tally: Counter[str]
) -> None:
    now = meters[0].clock()
    for item in spec["reservations"]:
        event_id = f"ev-{item['id']}"
        found = []
        for on, meter in zip((path, ORACLE), meters, strict=True):
            watch = _Watch()
            if item["kind"] == "cancel":
                ask = partial(meter.cancel_reservation, event_id)
            elif item["kind"] == "commit":
                ask = partial(meter.commit_reservation, event_id, item["actual"])
            else:
                when = now + timedelta(seconds=item["offset_seconds"])
                made = answer(
                    partial(make_event, item["charges"], when, event_id, item["metadata"])
                )
                if isinstance(made, tuple):
                    found.append(made)
                    continue
                ttl_us = item["ttl_seconds"] * 1_000_000
                ask = partial(reserve_on, on, meter, made, ttl_us)
            with watch.active():
                found.append(answer(ask))
            assert set(watch.reasons) <= HELD, watch.reasons
            tally["reservations fell back"] += on != ORACLE and watch.first_use
        assert found[0] == found[1], item


def _check_left_allowed(meter: Meter, event: UsageEvent, expected: object) -> bool:
    """A check the reference engine may answer: it raises, a recurring grant's
    issue may be due, or it falls before a current first-use window."""
    if isinstance(expected, tuple):
        return True
    subjects = {c.subject for c in event.charges}
    with meter.sql_engine.connect() as connection:
        if connection.execute(select(grant_schedules.c.subject)).first() is not None:
            return True
        starts = connection.execute(
            select(current_windows.c.window_start_us).where(current_windows.c.subject.in_(subjects))
        )
        return any(start is not None and start > event.occurred_at_us for (start,) in starts)


def _compare_checks(
    meters: tuple[Meter, Meter], specs: list[dict[str, Any]], tally: Counter[str]
) -> None:
    """`check` by the path (its fast check) and by the reference
    engine on the oracle's database: a check may issue a recurring grant
    that is due (reading its window makes it), so both databases see it."""
    tested, oracle = meters
    now = tested.clock()
    for spec in specs:
        when = now + timedelta(seconds=spec["offset_seconds"])
        ask = partial(tested.check, charges=spec["charges"], occurred_at=when)
        watch = _Watch()
        checked = reference_events("check")
        with watch.active():
            fast = answer(partial(ask, metadata=spec["metadata"]))
        # The reference engine checked it only when the fast check declined.
        assert (reference_events("check") > checked) <= bool(watch.checks_left), spec
        made = answer(partial(make_event, spec["charges"], when, "check", spec["metadata"]))
        if isinstance(made, tuple):
            assert fast == made, spec
            continue
        reference = oracle._engine.path(ORACLE)
        expected = answer(partial(reference.check, made, oracle.database.now_us()))
        assert fast == expected, spec
        if watch.checks_left:
            assert set(watch.checks_left) <= CHECK_DECLINED, (watch.checks_left, spec)
            assert _check_left_allowed(tested, made, expected), spec
        elif any(c.limit in BREAKERS for c in made.charges):
            tally["breaker checks"] += 1


def _prepare(urls: list[str]) -> None:
    """What every stream starts from, on the path's database and the
    oracle's (`differential.prepared` keeps them as templates): the limits,
    their first prices and the first time zones, as SQLAlchemy writes them
    on every path."""
    clock = FrozenClock(START - timedelta(days=40))
    with ExitStack() as stack:
        for url in urls:
            meter = stack.enter_context(Meter(url, clock=clock))
            meter.set_limits(LIMITS)
            for limit, per_unit, currency in FIRST_PRICES:
                since = START - timedelta(days=1)
                if isinstance(per_unit, dict):
                    meter.set_price(limit, None, currency, since, **per_unit)
                else:
                    meter.set_price(limit, per_unit, currency, since)
            for subject, zone in FIRST_ZONES:
                meter.set_time_zone(subject, zone)


def _run(
    path: str,
    urls: list[str],
    stream: list[dict[str, Any]],
    specs: list[dict[str, Any]],
    tally: Counter[str],
    imports: Sequence[ImportPolicy | None] = (None,) * 5,
) -> None:
    """The stream on copies of `_prepare`'s databases."""
    clock = FrozenClock(START - timedelta(days=40))
    with ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip((path, ORACLE), urls, strict=True)
        )
        # Every subject's breakers past their baseline from a minute before
        # START; the charge at START trips them (then released now and then).
        primed = [(subject, name, 1) for subject in SUBJECTS for name in BREAKERS]
        for number, seconds in enumerate((60, 0)):
            clock.set(START - timedelta(seconds=seconds))
            made = make_event(primed, clock(), f"primed-{number}")
            _decide(path, meters, [made.record()], "raise", tally)
        tested.database.run(tested._engine.limits.refresh)  # a warm process: limits cached
        singly = path == "one_trip"
        # Every other spec's changes are made by another process (a meter
        # with a cache of its own): the tested one must see them at once.
        other = stack.enter_context(Meter(urls[0], clock=clock))
        for number, spec in enumerate(stream):
            clock.advance(seconds=spec["advance_seconds"])
            _changes((other if number % 2 else tested, oracle), spec, number)
            tally["tiered prices"] += sum(
                isinstance(per_unit, dict) and limit != "bucket"  # (refused on a bucket)
                for limit, per_unit, _, _ in spec["prices"]
            )
            records = []
            for item in spec["events"]:
                if singly or spec["singly"]:
                    clock.advance(seconds=item["advance_seconds"])
                when = clock() + timedelta(seconds=item["offset_seconds"])
                made = make_event(item["charges"], when, f"ev-{item['id']}", item["metadata"])
                if singly or spec["singly"]:
                    _decide(path, meters, [made.record()], item["invalid"], tally)
                else:
                    records.append(made.record())
            if records:
                _decide(path, meters, records, spec["invalid"], tally, imports[number])
                tally["imported batches"] += imports[number] is not None
            if not singly:  # the one-trip function holds no reservation
                _reservations(path, meters, spec, tally)
            if specs:
                _compare_checks(meters, specs, tally)
        found, expected = stored(tested), stored(oracle)
        for table, rows in expected.items():  # the stream in full: nothing shrinks it
            assert found[table] == rows, (table, found[table], rows, stream)
        now_us = oracle.database.now_us()
        assert rates(tested, now_us) == pytest.approx(rates(oracle, now_us), rel=1e-9), stream
        # Each ledger proves itself: a full audit finds nothing (but the
        # reservations held past their time to live: no sweeper runs here).
        for meter in meters:
            found_wrong = [
                v
                for v in run_audit(meter, full=True).violations
                if v.invariant != Invariant.RESERVATION_UNRESOLVED
            ]
            assert found_wrong == [], (found_wrong, stream)
        gauged = [row for row in found["counters"] if row[0] in GAUGES and row[4]]
        tally["gauge levels"] += len(gauged)
        paced = [row for row in found["counters"] if row[0] in PACED and row[5]]
        tally["paced denials"] += len(paced)
        tally["quarantines"] += sum(row[-1] is not None for row in found["breakers"])
        # Windows of days and months that start or end at no UTC midnight: a zone's.
        zoned = [
            row
            for row in found["counters"]
            if row[0] in ZONED and (row[2] % DAY_US or row[3] % DAY_US)
        ]
        tally["zoned windows"] += len(zoned)


# -- the suite -----------------------------------------------------------------------

# (path, database, examples): within the time of the files this suite replaced.
SLOW = pytest.mark.slow
PATHS = [
    pytest.param("one_trip", "postgresql", examples(40), id="one_trip-postgresql"),
    pytest.param("direct", "sqlite", examples(60), id="direct-sqlite", marks=SLOW),
    pytest.param("direct", "postgresql", examples(30), id="direct-postgresql"),
    pytest.param("connection", "sqlite", examples(60), id="connection-sqlite", marks=SLOW),
    pytest.param("connection", "postgresql", examples(25), id="connection-postgresql"),
]


@pytest.mark.parametrize(("path", "database", "examples"), PATHS)
def test_the_path_decides_as_the_reference_engine(
    request: pytest.FixtureRequest, path: str, database: str, examples: int
) -> None:
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    tally: Counter[str] = Counter()
    # `check` has a fast path of its own, on the direct connections and on SQLAlchemy's.
    asked = checks if path in ("direct", "connection") else st.just([])

    @settings(SETTINGS, max_examples=examples)
    @given(stream=streams, specs=asked)
    @example(stream=_rare(), specs=[])
    def differential(stream: list[dict[str, Any]], specs: list[dict[str, Any]]) -> None:
        with databases(request, database, 2) as urls:
            _run(path, urls, stream, specs, tally)

    # Copies of prepared databases, under the name its body had when each
    # example set its databases up: the same source, the same examples.
    with prepared(request, database, 2, _prepare) as databases:
        differential()
    # Not vacuous: most events were the path's own.
    assert tally["fell back"] < tally["events"] // 4, tally
    assert tally["gauge levels"] >= examples // 8, tally  # gauges held levels
    assert tally["tiered prices"] >= 1, tally  # events priced by their windows' totals
    if path != "one_trip":  # (there the fast path decides them, as on "direct")
        assert tally["paced denials"] >= 1, tally  # the pace denied some
    assert tally["zoned windows"] >= 1, tally  # some windows were a zone's
    assert tally["quarantines"] >= 1, tally  # some breakers tripped
    if asked is checks:
        assert tally["breaker checks"] >= 1, tally  # the fast check read breakers
    if path == "one_trip":  # of the events it may decide, the function decides many
        assert all(tally[f"function: {need}"] >= 1 for need in FUNCTION_NEEDS), tally
        assert all(tally[f"function: {kind}"] >= 1 for kind in FUNCTION_PRICES), tally
        eligible = tally["events"] - tally["unsuited"] - tally["not for the function"]
        assert tally["applied"] >= eligible // 3, tally


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_an_import_decides_as_the_reference_engine(
    request: pytest.FixtureRequest, database: str
) -> None:
    """The same streams, their batches imported now and then with each
    combination of ``enforce`` and ``allow_late``: the direct path's
    results, counters and notices are the reference engine's."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    tally: Counter[str] = Counter()

    @settings(SETTINGS, max_examples=examples(6))
    @given(stream=streams, imports=policies)
    def differential(stream: list[dict[str, Any]], imports: list[ImportPolicy | None]) -> None:
        with databases(request, database, 2) as urls:
            _run("direct", urls, stream, [], tally, imports)

    # (As above: the same source, the same examples.)
    with prepared(request, database, 2, _prepare) as databases:
        differential()
    assert tally["imported batches"] >= 2, tally
    assert tally["fell back"] < tally["events"] // 4, tally


# -- counters a batch cannot deny, decided in aggregate ------------------------------

ROOM_START = datetime(2026, 11, 10, 12, tzinfo=UTC)
ROOM_LIMITS = [
    Limit("calls", maximum=10, period="1mo", window="calendar"),
    spend_limit("usd", "0.20", "USD", "1mo", window="calendar"),
    Limit("seats", maximum=100, period="1mo", window="calendar", distinct="user"),
]
# Per subject: what it used before the batch, and the units its batch charges
# beyond what is left of the counter that binds it (`ROOM_BATCH`).
ROOM_BEFORE = {"granted": 4, "plain": 3, "spender": 5}
PAIR = ("direct", ORACLE)


def _room_batch(offset: int) -> list[tuple[str, int]]:
    """(subject, events) of the batch: each subject's sum on its binding
    counter is its room plus ``offset``. "granted" (an entitlement of 12,
    a grant of 5): calls' own room 8, then the grant pays; "plain": calls'
    room 7, then denied; "spender" (an entitlement of 100 calls): the spend
    cap's room of 15 cents, then denied."""
    return [("granted", 8 + offset), ("plain", 7 + offset), ("spender", 15 + offset)]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_a_batch_at_a_counters_room_decides_as_the_reference_engine(
    request: pytest.FixtureRequest, database: str, offset: int
) -> None:
    """A sum one below, exactly at and one above the room of a counter with
    money, grants, an entitlement and seats beside it: the aggregate
    shortcut (`metering.domain.room`) takes the first two, never the third
    (but for "granted", whose grant pays one unit past its own room)."""
    covered = _room_case(request, database, _room_batch(offset))
    outcomes = Counter(a.record.outcome for a in covered.found)
    assert outcomes["denied"] == (2 if offset == 1 else 0), outcomes
    # The shortcut took the batch's events unless a counter had no room for them all.
    every = {"granted", "plain", "spender"}
    assert covered.subjects == (every if offset < 1 else {"granted"}), covered.subjects


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_a_batch_at_a_grants_room_decides_as_the_reference_engine(
    request: pytest.FixtureRequest, database: str, offset: int
) -> None:
    """ "granted"'s calls one below, exactly at and one above its own room (8)
    and its grants' (5, and a second grant of 2 after it, `second=True`):
    the shortcut draws on them for the first two, never the third."""
    covered = _room_case(request, database, [("granted", 15 + offset)], second=True)
    outcomes = Counter(a.record.outcome for a in covered.found)
    assert outcomes["denied"] == (1 if offset == 1 else 0), outcomes
    assert covered.subjects == (set() if offset == 1 else {"granted"}), covered.subjects
    calls = [a.record.charges[0] for a in covered.found]  # each event's first charge
    drawn = sum(amount for row in calls if len(row) > ROW_FIELDS for _, amount in row[ROW_FIELDS])
    assert drawn == 7 + min(offset, 0)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_single_charges_at_a_counters_room_decide_as_the_reference_engine(
    request: pytest.FixtureRequest, database: str, offset: int
) -> None:
    """Events of one charge, no money nor seat (`_Applying.decide` makes
    their rows itself), one below, exactly at and one above the room of a
    plain counter (7) and of one with an entitlement and a grant ("granted":
    its own room 8, then the grant's 5): the shortcut takes the first two,
    never the third."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    taken: Counter[str] = Counter()
    made = {name: getattr(fast, name) for name in ("allowed_row", "drawn_row")}

    def counting(name: str, subject: str, *args: Any) -> Any:
        taken[subject] += 1
        return made[name](subject, *args)

    clock = FrozenClock(ROOM_START)
    with databases(request, database, 2) as urls, ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip(PAIR, urls, strict=True)
        )
        for meter in meters:
            meter.set_limits([ROOM_LIMITS[0]])
            meter.set_entitlement("granted", "calls", 12, ROOM_START - timedelta(days=1))
            meter.grant("granted", "calls", 5, grant_id="top-up")
            for subject, used in ROOM_BEFORE.items():
                meter.consume(subject, "calls", used, event_id=f"before-{subject}")
        batch = {"plain": 7 + offset, "granted": 13 + offset}
        records = [
            make_event([(subject, "calls", 1)], clock(), f"{subject}-{n}").record()
            for subject, count in batch.items()
            for n in range(count)
        ]
        records.sort(key=lambda record: record.event_id[::-1])  # the subjects interleaved
        with pytest.MonkeyPatch.context() as patch:
            for name in made:
                patch.setattr(fast, name, partial(counting, name))
            found = [apply_on(on, m, records, "reject") for on, m in zip(PAIR, meters, strict=True)]
        assert [_decided(a) for a in found[0]] == [_decided(a) for a in found[1]]
        assert stored(tested) == stored(oracle)
    outcomes = Counter(a.record.outcome for a in found[0] if a.record is not None)
    assert outcomes["denied"] == (2 if offset == 1 else 0), outcomes
    assert taken == ({} if offset == 1 else batch), taken


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("stacked", [False, True])
def test_plain_events_at_their_times_bounds_decide_as_the_reference_engine(
    request: pytest.FixtureRequest, database: str, stacked: bool
) -> None:
    """Events on plain limits (`_Applying.plan` finds their keys itself), of
    one charge or ``stacked`` with a charge of a limit of a longer lateness,
    one microsecond inside and outside the first's lateness and the future's
    tolerance, and of cost 0: the same answers as the reference engine;
    only those outside and the cost of 0 are checked by `rules_for`."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    checked: list[str] = []
    rules_for = fast.rules_for

    def counting(event: EventRecord, *args: Any) -> Any:
        checked.append(event.event_id)
        return rules_for(event, *args)

    limits = [
        Limit("calls", maximum=100, period="1mo", window="calendar", lateness="60s"),
        Limit("daily", maximum=100, period="1d", window="calendar", lateness="1h"),
    ]
    daily = [("plain", "daily", 1)] if stacked else []
    late, future = timedelta(seconds=60), timedelta(microseconds=FUTURE_TOLERANCE_US)
    micro = timedelta(microseconds=1)
    times = {
        "late-in": ROOM_START - late,
        "late-out": ROOM_START - late - micro,
        "future-in": ROOM_START + future,
        "future-out": ROOM_START + future + micro,
        "now": ROOM_START,
    }
    records = [
        make_event([("plain", "calls", 1), *daily], at, event_id).record()
        for event_id, at in times.items()
    ]
    records.append(make_event([("plain", "calls", 0), *daily], ROOM_START, "free").record())
    clock = FrozenClock(ROOM_START)
    with databases(request, database, 2) as urls, ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip(PAIR, urls, strict=True)
        )
        for meter in meters:
            meter.set_limits(limits)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fast, "rules_for", counting)
            found = [apply_on(on, m, records, "reject") for on, m in zip(PAIR, meters, strict=True)]
        assert [_decided(a) for a in found[0]] == [_decided(a) for a in found[1]]
        assert stored(tested) == stored(oracle)
    outcomes = {a.record.event_id: a.record.outcome for a in found[0] if a.record is not None}
    rejected = {"late-out", "future-out", "free"}
    assert outcomes == {i: "rejected" if i in rejected else "allowed" for i in outcomes}
    assert set(checked) == rejected, checked


@dataclass
class _Covered:
    found: list[Answer]  # the tested path's answers
    subjects: set[str]  # the subjects of the events the shortcut took


def _room_case(
    request: pytest.FixtureRequest,
    database: str,
    batch: list[tuple[str, int]],
    second: bool = False,
) -> _Covered:
    """``batch`` (subject, events) applied by the direct path and by the
    reference engine after `ROOM_LIMITS`' set-up: the same answers and
    stored state."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    covered: set[str] = set()
    allowed = fast._Applying._allowed

    def counting(self: fast._Applying, *args: Any) -> Any:
        covered.add(args[1].charges[0][0])
        return allowed(self, *args)

    clock = FrozenClock(ROOM_START)
    with databases(request, database, 2) as urls, ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip(PAIR, urls, strict=True)
        )
        for meter in meters:
            meter.set_limits(ROOM_LIMITS)
            meter.set_price("calls", "0.01", "USD", ROOM_START - timedelta(days=1))
            meter.set_entitlement("granted", "calls", 12, ROOM_START - timedelta(days=1))
            meter.set_entitlement("spender", "calls", 100, ROOM_START - timedelta(days=1))
            meter.grant("granted", "calls", 5, grant_id="top-up")
            if second:
                meter.grant("granted", "calls", 2, grant_id="later", priority=1)
            for subject, used in ROOM_BEFORE.items():
                meter.consume(subject, "calls", used, event_id=f"before-{subject}")
        records = []
        for subject, count in batch:
            for n in range(count):
                charges = [(subject, "calls", 1), (subject, "seats", 1)]
                made = make_event(charges, clock(), f"{subject}-{n}", {"user": f"u{n % 3}"})
                records.append(made.record())
        records.sort(key=lambda record: record.event_id[::-1])  # the subjects interleaved
        before = reference_events()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fast._Applying, "_allowed", counting)
            found = [apply_on(on, m, records, "reject") for on, m in zip(PAIR, meters, strict=True)]
        assert reference_events() - before == len(records)  # the oracle's only
        assert [_decided(a) for a in found[0]] == [_decided(a) for a in found[1]]
        assert stored(tested) == stored(oracle)
    return _Covered(found[0], covered)


def _decided(found: Answer) -> tuple[object, ...]:
    record = found.record
    assert record is not None
    return (found.kind, record.event_id, record.outcome, record.denied_by, record.charges)


def _shortcut_case(
    request: pytest.FixtureRequest,
    database: str,
    limits: list[Limit],
    setup: Any,
    records: list[EventRecord],
) -> _Covered:
    """``records`` applied by the direct path and by the reference engine,
    each meter set up with ``limits`` and ``setup(meter)`` at `ROOM_START`
    (its clock): the same answers and stored state; the subjects of the
    events the shortcut took (`_Applying._allowed` or a row made by
    `allowed_row`)."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    covered: set[str] = set()
    allowed, made = fast._Applying._allowed, fast.allowed_row

    def counting(self: fast._Applying, *args: Any) -> Any:
        covered.add(args[1].charges[0][0])
        return allowed(self, *args)

    def counting_row(subject: str, *args: Any) -> Any:
        covered.add(subject)
        return made(subject, *args)

    clock = FrozenClock(ROOM_START)
    with databases(request, database, 2) as urls, ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip(PAIR, urls, strict=True)
        )
        for meter in meters:
            meter.set_limits(limits)
            setup(meter, clock)
        clock.set(ROOM_START)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fast._Applying, "_allowed", counting)
            patch.setattr(fast, "allowed_row", counting_row)
            found = [apply_on(on, m, records, "reject") for on, m in zip(PAIR, meters, strict=True)]
        assert [_decided(a) for a in found[0]] == [_decided(a) for a in found[1]]
        assert stored(tested) == stored(oracle)
    return _Covered(found[0], covered)


def _ones(subject: str, limit: str, count: int) -> list[EventRecord]:
    at = ROOM_START
    return [make_event([(subject, limit, 1)], at, f"{subject}-{n}").record() for n in range(count)]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize(("alert", "count"), [("60%", 2), ("60%", 3), ("8", 4), ("8", 5)])
def test_own_thresholds_a_batch_does_not_cross_are_decided_in_aggregate(
    request: pytest.FixtureRequest, database: str, alert: str, count: int
) -> None:
    """A subject's own threshold (6 units, or 8) one unit past and at its
    batch's last event, 3 used before: the shortcut takes the batch that
    crosses none, the reference engine's notice the one that does."""

    def setup(meter: Meter, clock: FrozenClock) -> None:
        meter.set_alert("alerted", "calls", [alert])
        meter.consume("alerted", "calls", 3, event_id="before")

    limits = [Limit("calls", maximum=10, period="1mo", window="calendar")]
    covered = _shortcut_case(request, database, limits, setup, _ones("alerted", "calls", count))
    crosses = 3 + count >= (6 if alert == "60%" else 8)
    assert covered.subjects == (set() if crosses else {"alerted"})


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("tripping", [False, True])
def test_breakers_no_charge_can_trip_are_decided_in_aggregate(
    request: pytest.FixtureRequest, database: str, tripping: bool
) -> None:
    """A batch on a limit with a breaker: taken by the shortcut (the breaker
    stepped as the reference engine steps it) unless the breaker has been
    past its multiple for a minute: its first charge then trips it and the
    rest are held to the quarantine, as the reference engine decides."""

    def setup(meter: Meter, clock: FrozenClock) -> None:
        clock.set(ROOM_START)
        meter.consume("steady", "guarded", 1, event_id="steady-before")
        if tripping:  # past 2x its floor since 90 seconds before the batch
            clock.set(ROOM_START - timedelta(seconds=90))
            meter.consume("runaway", "guarded", 5, event_id="runaway-before")

    limits = [
        Limit(
            "guarded",
            maximum=100,
            period="1mo",
            window="calendar",
            breaker="2x",
            breaker_floor=0.000001,
            quarantine_max=8,
        )
    ]
    records = _ones("steady", "guarded", 6) + _ones("runaway", "guarded", 6)
    covered = _shortcut_case(request, database, limits, setup, records)
    assert covered.subjects == ({"steady"} if tripping else {"steady", "runaway"})
    outcomes = Counter(a.record.outcome for a in covered.found if a.record is not None)
    # Tripped by its batch's first event (6 used), it is held to 8: 3 denied.
    assert outcomes["denied"] == (3 if tripping else 0), outcomes


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize("breaker", [None, "10x"])
def test_dimensions_and_breakers_take_the_short_way(
    request: pytest.FixtureRequest, database: str, breaker: str | None
) -> None:
    """Events on a limit with dimensions (and a breaker): `_Applying.plan`
    finds their rules and keys itself (no `rules_for`), the shortcut makes
    their rows, and the rollups and breakers are those of the reference engine."""
    checked: list[str] = []
    rules_for = fast.rules_for

    def counting(event: EventRecord, *args: Any) -> Any:
        checked.append(event.event_id)
        return rules_for(event, *args)

    def setup(meter: Meter, clock: FrozenClock) -> None:
        meter.consume("a", "routed", 1, event_id="before", metadata={"route": "r-0"})

    limits = [
        Limit(
            "routed",
            maximum=100,
            period="1mo",
            window="calendar",
            dimensions=("route",),
            breaker=breaker,
        )
    ]
    records = [
        make_event(
            [(subject, "routed", 1 + n % 3)],
            ROOM_START,
            f"{subject}-{n}",
            metadata={"route": f"r-{n % 2}"} if n % 4 else None,
        ).record()
        for n in range(8)
        for subject in ("a", "b")
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "rules_for", counting)
        covered = _shortcut_case(request, database, limits, setup, records)
    assert covered.subjects == {"a", "b"}
    assert checked == []


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    ("price", "room"),
    [
        # 3 used before: 3 cents and the fee's 3; then 1 cent to 5 units, 2 after.
        ({"model": "graduated", "tiers": ["5:0.01", "inf:0.02"]}, 8),
        # 3 used before: 6 cents and the fee's 3; then 2 cents a unit.
        ({"per_unit": "0.02"}, 5),
    ],
)
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_counted_prices_at_a_spend_caps_room_are_decided_in_aggregate(
    request: pytest.FixtureRequest,
    database: str,
    price: dict[str, Any],
    room: int,
    offset: int,
) -> None:
    """Events priced by their counter (a tiered price, or a flat fee), one
    below, exactly at and one above the room of the spend cap (0.20 USD):
    the shortcut takes the first two (their amounts found from the counter
    before each), never the third."""

    def setup(meter: Meter, clock: FrozenClock) -> None:
        per_unit = price.get("per_unit")
        options = {k: v for k, v in price.items() if k != "per_unit"}
        when = ROOM_START - timedelta(days=1)
        meter.set_price("calls", per_unit, "USD", when, flat_fee="0.03", **options)
        meter.consume("spender", "calls", 3, event_id="before")

    limits = [Limit("calls", maximum=100, period="1mo", window="calendar"), ROOM_LIMITS[1]]
    records = _ones("spender", "calls", room + offset)
    covered = _shortcut_case(request, database, limits, setup, records)
    assert covered.subjects == (set() if offset == 1 else {"spender"})
    outcomes = Counter(a.record.outcome for a in covered.found if a.record is not None)
    assert outcomes["denied"] == (1 if offset == 1 else 0), outcomes


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    "price",
    [
        {"per_unit": "0.01"},
        {"model": "graduated", "tiers": ["4:0.01", "inf:0.02"], "flat_fee": "0.03"},
    ],
)
def test_priced_events_of_one_charge_are_decided_with_their_spend_charge(
    request: pytest.FixtureRequest, database: str, price: dict[str, Any]
) -> None:
    """Events of one priced charge (a flat price; tiers and a fee, crossed in
    the batch) on covered counters, of a subject whose grant pays past its
    maximum and of one without: each planned and decided with its one spend
    charge (`_Applying._priced_one`, `_paired`), as the reference engine
    decides them."""

    def setup(meter: Meter, clock: FrozenClock) -> None:
        per_unit = price.get("per_unit")
        options = {k: v for k, v in price.items() if k != "per_unit"}
        meter.set_price("calls", per_unit, "USD", ROOM_START - timedelta(days=1), **options)
        meter.grant("granted", "calls", 5, grant_id="top-up")
        meter.consume("granted", "calls", 3, event_id="before")

    limits = [
        Limit("calls", maximum=5, period="1mo", window="calendar"),
        spend_limit("usd", "1", "USD", "1mo", window="calendar"),
    ]
    records = _ones("granted", "calls", 6) + _ones("plain", "calls", 5)
    records.sort(key=lambda record: record.event_id[::-1])  # the subjects interleaved
    paired: list[str] = []
    made = fast._Applying._paired

    def counting(self: fast._Applying, index: int, event: EventRecord, *args: Any) -> Any:
        paired.append(event.event_id)
        return made(self, index, event, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast._Applying, "_paired", counting)
        covered = _shortcut_case(request, database, limits, setup, records)
    # (The setup's one event, "before", is paired too: a single event's room.)
    assert sorted(e for e in paired if e != "before") == sorted(r.event_id for r in records)
    assert covered.subjects == {"granted", "plain"}
    assert all(a.record is not None and a.record.outcome == "allowed" for a in covered.found)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_single_events_of_the_mix_are_decided_by_their_room(
    request: pytest.FixtureRequest, database: str
) -> None:
    """Events applied one at a time (a batch of one, as `consume` makes) of a
    subject with a price and a spend cap, an entitlement, a recurring grant
    and a seat limit: those its own room fits (then its grant's) taken by the
    shortcut (`_Applying._allowed`), the one past both by its rules
    (`_Applying._verdict`), each as the reference engine decides it."""
    if database == "postgresql":
        request.applymarker(pytest.mark.postgres)
    limits = [
        Limit("calls", maximum=10, period="1mo", window="calendar"),
        spend_limit("usd", "1", "USD", "1mo", window="calendar"),
        Limit("seats", maximum=10, period="1mo", window="calendar", distinct="user"),
    ]
    records = [
        make_event(
            [("mixed", "calls", 1), ("mixed", "seats", 1)],
            ROOM_START,
            f"mixed-{n}",
            {"user": f"u-{n % 2}"},
        ).record()
        for n in range(6)
    ]
    taken: list[str] = []
    judged: list[str] = []
    allowed, verdict = fast._Applying._allowed, fast._Applying._verdict

    def counting(self: fast._Applying, index: int, event: EventRecord, *args: Any) -> Any:
        taken.append(event.event_id)
        return allowed(self, index, event, *args)

    def judging(self: fast._Applying, index: int, event: EventRecord, *args: Any) -> Any:
        judged.append(event.event_id)
        return verdict(self, index, event, *args)

    clock = FrozenClock(ROOM_START)
    with databases(request, database, 2) as urls, ExitStack() as stack:
        meters = tested, oracle = tuple(
            on_path(on, stack.enter_context(Meter(url, clock=clock)))
            for on, url in zip(PAIR, urls, strict=True)
        )
        for meter in meters:
            meter.set_limits(limits)
            meter.set_price("calls", "0.01", "USD", ROOM_START - timedelta(days=1))
            meter.set_entitlement("mixed", "calls", 3)
            meter.grant("mixed", "calls", 2, grant_id="monthly", every="1mo")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fast._Applying, "_allowed", counting)
            patch.setattr(fast._Applying, "_verdict", judging)
            for record in records:
                found = [
                    apply_on(on, m, [record], "reject") for on, m in zip(PAIR, meters, strict=True)
                ]
                assert [_decided(a) for a in found[0]] == [_decided(a) for a in found[1]]
        assert stored(tested) == stored(oracle)
    assert taken == [f"mixed-{n}" for n in range(5)]
    assert judged == ["mixed-5"]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_batchs_draws_on_grants_are_written_once_each_as_the_reference_engines(
    request: pytest.FixtureRequest, database: str
) -> None:
    """The draws a batch writes (grants' ``used``, counters' ``granted``)
    are what its pots recorded as they drew: several grants in a pot (one
    partly used, one expired at some of the events), late events drawing in
    the window before while others draw in the current one (two windows of
    one pair in a batch), and a grant drawn up then events denied (decided
    by `decide`, not the shortcut): the same as the reference engine's."""
    limits = [Limit("calls", maximum=3, period="1h", window="calendar", lateness="2h")]
    hour = timedelta(hours=1)

    def setup(meter: Meter, clock: FrozenClock) -> None:
        clock.set(ROOM_START - 2 * hour)
        meter.grant("several", "calls", 4, grant_id="s-first", priority=1)
        meter.grant("several", "calls", 5, grant_id="s-then")
        meter.grant("several", "calls", 3, grant_id="s-soon", expires_at=ROOM_START - hour / 4)
        meter.grant("late", "calls", 10, grant_id="l-only")
        meter.grant("one", "calls", 3, grant_id="o-only")
        clock.set(ROOM_START - hour / 2)
        meter.consume("late", "calls", 4, event_id="late-before")  # the grant pays 1
        clock.set(ROOM_START)
        meter.consume("several", "calls", 5, event_id="several-before")  # s-first pays 2
        meter.consume("one", "calls", 4, event_id="one-before")  # o-only pays 1

    at = ROOM_START + timedelta(minutes=1)
    events = [
        *(("several", ROOM_START - n * hour / 10, 2, f"several-{n}") for n in range(5)),
        *(("late", at - (n % 2) * hour / 2, 1, f"late-{n}") for n in range(6)),
        *(("one", at, 1, f"one-{n}") for n in range(4)),
    ]
    records = [
        make_event([(subject, "calls", cost)], when, event_id).record()
        for subject, when, cost, event_id in events
    ]
    records.sort(key=lambda record: record.event_id[::-1])  # the subjects interleaved
    found = _shortcut_case(request, database, limits, setup, records)
    outcomes = Counter(
        (a.record.event_id.split("-")[0], a.record.outcome)
        for a in found.found
        if a.record is not None
    )
    assert outcomes == {
        ("several", "allowed"): 5,
        ("late", "allowed"): 6,
        ("one", "allowed"): 2,
        ("one", "denied"): 2,
    }, outcomes
