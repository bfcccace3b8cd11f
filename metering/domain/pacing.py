"""Pacing: a window's maximum spread over the window, so a budget lasts it.

A paced limit allows, at an instant ``t`` of a window ``[start, end)``, at
most ``maximum * (t - start) / (end - start)`` (rounded down) plus a
``burst``, and never more than the maximum. A burst is units, or a
percentage of the maximum in force (``"5%"``, the default). Grants are
not paced: they add to the paced allowance. A hard or shadow limit denies
what is ahead of the pace, with `back_on_pace_us` as its ``retry_at``; a
soft one allows it, as ``ahead_of_pace`` (within the maximum, not billed).
"""

from __future__ import annotations

import re
from typing import Final

from metering.domain.bounds import shown
from metering.errors import InvalidLimit

DEFAULT_BURST: Final = "5%"
AHEAD_OF_PACE: Final = "ahead_of_pace"  # a soft charge past the pace, within the maximum
_PERCENT: Final = re.compile(r"([0-9]{1,3})%")
_UNITS: Final = re.compile(r"[0-9]{1,16}")

Burst = int | str  # units, or "P%" of the maximum in force


def parse_burst(value: object, ceiling: int) -> Burst:
    """Units (an int or its digits, at most ``ceiling``) or a whole percentage
    from ``"0%"`` to ``"100%"``, as `burst_units` reads it."""
    if isinstance(value, bool):
        raise InvalidLimit("burst", f"give units or a percentage like '5%', not {shown(value)}")
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and _UNITS.fullmatch(text):
        text = int(text)
    if isinstance(text, int):
        if not 0 <= text <= ceiling:
            raise InvalidLimit("burst", f"must be between 0 and {ceiling:,} units, got {text}")
        return text
    match = _PERCENT.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) > 100:
        raise InvalidLimit(
            "burst", f"{shown(value)} is not units or a percentage from 0% to 100% like '5%'"
        )
    return f"{int(match.group(1))}%"


def burst_units(burst: Burst, maximum: int) -> int:
    """The burst in units for this maximum (a percentage rounds down)."""
    if isinstance(burst, int):
        return burst
    return maximum * int(burst[:-1]) // 100


def paced_maximum(maximum: int, burst: Burst, window: tuple[int, int], at_us: int) -> int:
    """What the window allows by ``at_us``: its share of the maximum, plus the burst."""
    start, end = window
    length = end - start
    elapsed = min(max(at_us - start, 0), length)
    return min(maximum, maximum * elapsed // length + burst_units(burst, maximum))


def back_on_pace_us(maximum: int, burst: Burst, window: tuple[int, int], used: int) -> int | None:
    """The first instant of ``window`` whose paced maximum reaches ``used``
    (None: only the next window has room for it)."""
    if used > maximum:
        return None
    start, end = window
    wanted = used - burst_units(burst, maximum)
    if wanted <= 0:
        return start
    at = start - (-wanted * (end - start) // maximum)
    return at if at < end else None


def paced_retry_us(
    maximum: int, burst: Burst, window: tuple[int, int], wanted: int, at_us: int
) -> int | None:
    """When a denied charge that would bring the window's own usage to
    ``wanted`` fits the pace, if later in this window (else None: the next
    window's rule, or never)."""
    at = back_on_pace_us(maximum, burst, window, wanted)
    return at if at is not None and at > at_us else None


def ahead_of_pace(
    maximum: int, burst: Burst, window: tuple[int, int], used: int, at_us: int
) -> bool:
    """Whether a soft window's usage ``used`` is past the pace at ``at_us``, within the maximum."""
    return paced_maximum(maximum, burst, window, at_us) < used <= maximum
