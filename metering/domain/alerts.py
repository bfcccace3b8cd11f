"""Per-subject alert thresholds: one subject's own ``limit.threshold`` points.

``metering alerts set SUBJECT LIMIT --at 80% --at 5000`` replaces the
limit's thresholds (percentages of the subject's maximum and absolute
amounts) for that subject alone; the notices then fire as for the limit's
own (`metering.domain.notifications`), once per window and threshold.
`parse_points` reads the ``--at`` values.
"""

from __future__ import annotations

from collections.abc import Iterable

from metering.domain.bounds import shown
from metering.domain.limits import MAX_MAXIMUM, MAX_THRESHOLD_PERCENT, MAX_THRESHOLDS
from metering.errors import InvalidInput


def parse_points(values: Iterable[object]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``["80%", "5000", 90]``: (percentages, amounts), each sorted, no repeats.

    A string ending in ``%`` is a percentage (1 to 1000) of the maximum;
    any other whole number an amount of usage. At least one, at most
    `MAX_THRESHOLDS` of each kind.
    """
    if isinstance(values, str | bytes):
        values = [values]
    percents: set[int] = set()
    units: set[int] = set()
    listed = list(values)
    if not listed:
        raise InvalidInput("at", "give at least one threshold, such as 80% or 5000")
    for value in listed:
        if isinstance(value, bool):
            raise InvalidInput("at", f"{shown(value)} is not a threshold")
        if isinstance(value, int):
            units.add(_whole(value, MAX_MAXIMUM, value))
            continue
        if not isinstance(value, str):
            raise InvalidInput("at", f"{shown(value)} is not a threshold such as 80% or 5000")
        text = value.strip()
        if text.endswith("%"):
            percents.add(_number(text[:-1].strip(), MAX_THRESHOLD_PERCENT, value))
        else:
            units.add(_number(text, MAX_MAXIMUM, value))
    if len(percents) > MAX_THRESHOLDS or len(units) > MAX_THRESHOLDS:
        raise InvalidInput("at", f"at most {MAX_THRESHOLDS} percentages and amounts each")
    return tuple(sorted(percents)), tuple(sorted(units))


def _number(text: str, ceiling: int, original: object) -> int:
    if not text.isdigit() or len(text) > 16:
        raise InvalidInput("at", f"{shown(original)} is not a threshold such as 80% or 5000")
    return _whole(int(text), ceiling, original)


def _whole(value: int, ceiling: int, original: object) -> int:
    if not 1 <= value <= ceiling:
        raise InvalidInput("at", f"{shown(original)} must be between 1 and {ceiling}")
    return value


def shown_points(percents: Iterable[int], units: Iterable[int]) -> list[str]:
    """The thresholds as ``--at`` takes them: ``["80%", "5000"]``."""
    return [f"{p}%" for p in percents] + [str(u) for u in units]


__all__ = ["parse_points", "shown_points"]
