"""Seats: limits that count distinct values (``Limit(..., distinct="user")``; docs/seats.md).

``used`` in a window is the number of distinct values of the metadata key among its live
(allowed, not voided) events. A charge costs 1 when its value has no live event in the
subject's window yet (a new seat) and 0 when it has (a seat held: always allowed). The store
keeps `HELD` per value with a live event (`Seen`): a held value's further events write
nothing, and a void counts the value's other live events in the ledger, freeing the seat
with the last (`after_void`). The
charge must carry the key as 1 to 200 printable characters or a whole number (``7`` is
``"7"``) and cost 1: `value_of` raises `InvalidInput` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from metering.domain.bounds import shown
from metering.errors import InvalidInput

MAX_VALUE_CHARS: Final = 200
# A value's stored live events while it has one or more (0 once its last is voided).
HELD: Final = 1
# (limit name, subject, window start, value): one value in one window.
SeatKey = tuple[str, str, int, str]
# Live events per value, as read (under the counter's lock: `HELD` or 0) and kept up to date.
Seen = dict[SeatKey, int]


def value_of(key: str, limit: str, metadata: Mapping[str, Any] | None, cost: int) -> str:
    """The value an event's charge on distinct limit ``limit`` counts."""
    if cost != 1:
        raise InvalidInput(
            "cost", f"a charge on {limit!r} counts distinct {key!r} values: its cost must be 1"
        )
    if not metadata or key not in metadata:
        raise InvalidInput(
            "metadata",
            f"limit {limit!r} counts distinct values of {key!r}: "
            "the event's metadata must carry it",
        )
    found = metadata[key]
    if isinstance(found, int) and not isinstance(found, bool):
        found = str(found)
    if (
        not isinstance(found, str)
        or not found
        or len(found) > MAX_VALUE_CHARS
        or not found.isprintable()
    ):
        raise InvalidInput(
            "metadata",
            f"{key!r} must be a whole number or 1 to {MAX_VALUE_CHARS} printable characters, "
            f"got {shown(metadata[key])}",
        )
    return found


def seat_cost(seen: Mapping[SeatKey, int], key: SeatKey) -> int:
    """1 for a value with no live event in its window (a new seat), else 0."""
    return 0 if seen.get(key, 0) > 0 else 1


def after_void(live_events: int, others: int) -> tuple[int, int]:
    """A value's stored live events after one of them is voided, and the seats
    that frees (1 when it was the last, else 0): ``others`` is how many live
    events the ledger still has for it. A stored 0 frees nothing: a reset
    cleared the value since."""
    if live_events <= 0:
        return 0, 0
    return (HELD, 0) if others > 0 else (0, 1)


__all__ = [
    "HELD",
    "MAX_VALUE_CHARS",
    "SeatKey",
    "Seen",
    "after_void",
    "seat_cost",
    "value_of",
]
