"""Which dimensions a result was rolled up under, and how it was counted: a limit's history.

A limit's history is a list of `Era`, one per change of its dimensions, seat key or aggregation
(its first definition too), each stamped with the reset clock's tick the change advanced to. A
result records the tick it was written at (``results.reset_tick``); it was decided under the
last era whose tick is at or below it (`in_force`). Ticks, not instants: a change holds every
decision out while it ticks (`metering.storage.limits`), so a result written with the old
definition has a smaller tick whatever the clocks said. A result older than the history (before
migration 0047) is known only under a ``seeded`` era and when decided since the limit's last
definition then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metering.domain.limits import GAUGES


@dataclass(frozen=True, slots=True)
class Era:
    """A limit's dimensions from the reset clock's ``tick`` on (``since_us``:
    when they were set); ``seeded``: by migration 0047, from the limit then;
    ``distinct``: its seat key then (None: no seat limit, or not known);
    ``aggregation``: ``sum``, ``max`` or ``latest`` then (None: not known)."""

    tick: int
    since_us: int
    dimensions: tuple[str, ...]
    seeded: bool = False
    distinct: str | None = None
    aggregation: str | None = None


def era_in_force(history: Sequence[Era], tick: int, decided_at_us: int) -> Era | None:
    """The era of the result written at ``tick`` and decided at
    ``decided_at_us``, from its limit's ``history`` (by tick); None: unknown."""
    found: Era | None = None
    for era in history:
        if era.tick > tick:
            break
        found = era
    if found is not None:
        return found
    first = history[0] if history else None
    if first is not None and first.seeded and decided_at_us >= first.since_us:
        return first
    return None


def in_force(history: Sequence[Era], tick: int, decided_at_us: int) -> tuple[str, ...] | None:
    """The dimensions of `era_in_force` (None: unknown)."""
    era = era_in_force(history, tick, decided_at_us)
    return None if era is None else era.dimensions


def counted_by(
    history: Sequence[Era], tick: int | None, decided_at_us: int, today: str | None
) -> str | None:
    """The aggregation the result written at ``tick`` was counted by: its
    era's where known, else ``today``'s (None: the limit is gone)."""
    era = None if tick is None else era_in_force(history, tick, decided_at_us)
    return era.aggregation if era is not None and era.aggregation else today


def rolled_up_under(history: Sequence[Era], tick: int, decided_at_us: int) -> tuple[str, ...]:
    """`in_force`, or where unknown the first era's dimensions (a give-back
    must take from some rows: those of the oldest definition known)."""
    found = in_force(history, tick, decided_at_us)
    if found is not None:
        return found
    return history[0].dimensions if history else ()


def ever_dimensioned(history: Sequence[Era]) -> bool:
    """Whether any era of ``history`` has dimensions."""
    return any(era.dimensions for era in history)


def ever_seats(history: Sequence[Era]) -> bool:
    """Whether any era of ``history`` was a seat limit's (a seat key)."""
    return any(era.distinct for era in history)


def ever_gauge(history: Sequence[Era]) -> bool:
    """Whether any era of ``history`` was a gauge's (a level, not a sum)."""
    return any(era.aggregation in GAUGES for era in history)


def holds_a_sum(history: Sequence[Era], window_end_us: int) -> bool:
    """Whether the window ending at ``window_end_us`` of a limit with
    ``history`` holds only sums: never a gauge, or not over when the limit
    last became a sum (what a limit counts changes only while its windows
    not yet over have no usage: `metering.limits.service`)."""
    gauges = [number for number, era in enumerate(history) if era.aggregation in GAUGES]
    if not gauges:
        return True
    after = gauges[-1] + 1
    return after < len(history) and window_end_us > history[after].since_us
