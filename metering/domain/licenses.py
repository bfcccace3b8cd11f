"""Floating licenses: a concurrent limit's rules, as pure functions (docs/licenses.md).

A subject holds the units of its checkouts neither checked in nor past their expiry
(`held_units`); a checkout of ``cost`` fits when held plus ``cost`` stays at or below the
maximum (`fits`). Nothing else is counted, so no counter drifts: an expired checkout stops
counting at its expiry instant, whoever notices. Checking in moves one row from held to
released, once. ``limit.denied`` (``algorithm: "concurrent"``) is sent once per run of
denials, until a checkout fits again (`denied_document`); its ``retry_at`` is the first
instant enough checkouts will have expired for this one (`retry_at_us`). There is no
window, so ``limit.reset`` is never sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final

from metering.domain.notifications import _iso
from metering.errors import InvalidInput, WrongAlgorithm

DEFAULT_TTL_SECONDS: Final = 900.0  # 15 minutes
MAX_TTL_SECONDS: Final = 7 * 86_400.0

# A held checkout as the rules see it: (cost, expires_at_us).
Held = tuple[int, int]


class CheckoutState(StrEnum):
    HELD = "held"
    RELEASED = "released"


class ReleasedBy(StrEnum):
    CHECKIN = "checkin"
    EXPIRY = "expiry"


def validate_ttl(ttl_seconds: object) -> int:
    """A time to live in seconds (a number above 0, at most a week), as microseconds."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidInput("ttl_seconds", f"must be a number of seconds, got {ttl_seconds!r}")
    if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidInput("ttl_seconds", f"must be above 0 and at most {MAX_TTL_SECONDS:.0f}")
    return max(1, round(ttl_seconds * 1_000_000))


def consumed_concurrent(limit: str) -> WrongAlgorithm:
    """A concurrent limit is held, not spent: consume, check and reserve refuse it."""
    return WrongAlgorithm(limit, "concurrent", "check a license out (metering checkout)")


def held_units(checkouts: Iterable[Held], now_us: int) -> int:
    """Units held at ``now_us``: checkouts expire at their instant, exclusive."""
    return sum(cost for cost, expires_at_us in checkouts if expires_at_us > now_us)


def fits(held: int, cost: int, maximum: int) -> bool:
    return held + cost <= maximum


def retry_at_us(checkouts: Iterable[Held], cost: int, maximum: int, now_us: int) -> int | None:
    """When ``cost`` would fit if nothing were checked in (None: never, cost above maximum)."""
    if cost > maximum:
        return None
    live = sorted((expires, units) for units, expires in checkouts if expires > now_us)
    held = sum(units for _, units in live)
    for expires, units in live:
        if fits(held, cost, maximum):
            break
        held -= units
        now_us = expires
    return now_us


def denied_document(
    subject: str, limit: str, maximum: int, held: int, retry_at: int | None, now_us: int
) -> dict[str, Any]:
    """The ``limit.denied`` message of a floating license (as `payload_of`'s, no window)."""
    return {
        "type": "limit.denied",
        "timestamp": _iso(now_us),
        "data": {
            "subject": subject,
            "limit": limit,
            "algorithm": "concurrent",
            "maximum": maximum,
            "used": held,
            "threshold": None,
            "threshold_units": None,
            "window_start": None,
            "window_end": None,
            "resets_at": _iso(retry_at),
            "retry_at": _iso(retry_at),
            "event_id": None,
        },
    }
