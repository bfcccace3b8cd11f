"""What deciding a batch needs from the path that decides it.

A limit's rule states its needs once, when the limits are loaded
(`rule_needs`); a subject's allowances add their own (`subject_needs`); how
a batch is applied adds the rest (`batch_needs`). Each way of deciding
declares the needs it implements, and the engine gives a batch to the first
path whose set covers the batch's (`metering.engine.paths`). A need found
only while deciding (`EARLY_FIRST_USE`, `NOTICES`, `INVALID`, `REPEATED_ID`)
comes back in the path's decline, and the next path must implement it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from metering.domain.limits import Limit


class Need(StrEnum):
    BATCH = "batch"  # more than one event in one transaction
    INVALID = "invalid"  # an unacceptable event: rejected, or its error raised
    REPEATED_ID = "repeated_id"  # an id decided before: its stored answer
    REPEATED_COUNTER = "repeated_counter"  # one event charging one counter twice
    MONEY = "money"  # a priced limit or a spend cap: charges added in money
    SEATS = "seats"  # distinct values: a charge costs 1 for a new value, else 0
    GAUGE = "gauge"  # a charge reports a level: used is the peak or the last level
    PACING = "pacing"  # the maximum spread over the window (`metering.domain.pacing`)
    DIMENSIONS = "dimensions"  # usage rolled up by metadata keys
    MONTH_FIRST_USE = "month_first_use"  # a first-use window of calendar months
    ENTITLEMENTS = "entitlements"  # a subject's own maximum
    GRANTS = "grants"  # a subject's grants pay past the maximum
    RECURRING = "recurring"  # a recurring grant, issued when due
    OWN_THRESHOLDS = "own_thresholds"  # a subject's own thresholds
    NOTICES = "notices"  # webhooks, grant.low or dead letters written beside the results
    FORECAST = "forecast"  # a forecast lead: limit.forecast from the rates just written
    BREAKER = "breaker"  # a runaway breaker: its rates, quarantines and limit.quarantined
    RESERVATION = "reservation"  # a held reservation or a lease's block
    HELD_SEATS = "held_seats"  # a reservation of a seat limit (refused)
    HELD_GAUGE = "held_gauge"  # a reservation of a gauge (refused)
    IMPORT_FLAGS = "import_flags"  # an import that changes the rules
    DEAD_LETTERS = "dead_letters"  # malformed input recorded with the batch
    EARLY_FIRST_USE = "early_first_use"  # an event before its current first-use window
    TIME_ZONE = "time_zone"  # a window of a subject with a zone: local midnight, billing month


EVERY: Final = frozenset(Need)
NONE: Final[frozenset[Need]] = frozenset()
# Every need a batch with no hold, import nor dead letters may have before
# it is decided (`batch_needs`, whatever its charges): a path that implements
# them all takes every such batch.
UNHELD: Final = EVERY - {
    Need.RESERVATION,
    Need.HELD_SEATS,
    Need.HELD_GAUGE,
    Need.IMPORT_FLAGS,
    Need.DEAD_LETTERS,
    Need.EARLY_FIRST_USE,  # (these three are found while deciding)
    Need.NOTICES,
    Need.REPEATED_ID,
}


def rule_needs(limit: Limit, *, priced: bool) -> frozenset[Need]:
    """What charging ``limit`` needs (``priced``: a price is set on it)."""
    found: set[Need] = set()
    if priced or limit.currency is not None:
        found.add(Need.MONEY)
    if limit.distinct is not None:
        found.add(Need.SEATS)
    if limit.is_gauge:
        found.add(Need.GAUGE)
    if limit.pacing:
        found.add(Need.PACING)
    if limit.forecast_lead is not None:
        found.add(Need.FORECAST)
    if limit.breaker is not None:
        found.add(Need.BREAKER)
    if limit.dimensions:
        found.add(Need.DIMENSIONS)
    if (
        limit.algorithm != "token_bucket"
        and limit.window != "calendar"
        and limit.parsed_period.is_calendar_months
    ):
        found.add(Need.MONTH_FIRST_USE)
    return frozenset(found)


def subject_needs(
    *, entitled: bool, granted: bool, recurring: bool, thresholds: bool
) -> frozenset[Need]:
    """What a subject's own allowances on one limit need."""
    found: set[Need] = set()
    if entitled:
        found.add(Need.ENTITLEMENTS)
    if granted:
        found.add(Need.GRANTS)
    if recurring:
        found.add(Need.RECURRING)
    if thresholds:
        found.add(Need.OWN_THRESHOLDS)
    return frozenset(found)


def batch_needs(
    events: int, *, held: bool, imported: bool, dead_letters: bool, charged: frozenset[Need]
) -> frozenset[Need]:
    """A batch's needs: how it is applied, and what its charges need (``charged``)."""
    found = set(charged)
    if events > 1:
        found.add(Need.BATCH)
    if dead_letters:
        found.add(Need.DEAD_LETTERS)
    if held:
        found.add(Need.RESERVATION)
        if Need.SEATS in charged:
            found.add(Need.HELD_SEATS)
        if Need.GAUGE in charged:
            found.add(Need.HELD_GAUGE)
    if imported:
        found.add(Need.IMPORT_FLAGS)
    return frozenset(found)
