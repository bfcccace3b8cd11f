"""A counter's recent rate, and when its window's allowance runs out at it.

The rate is a decayed sum kept on the counter row, in units per second: a write at
``t`` adding ``cost`` sets ``rate' = rate * exp(-(t - rate_at) / TAU) + cost / TAU``
(a give-back or a denial adds nothing; an instant before ``rate_at`` does not decay;
past ``FORGET_TAUS`` or below ``TINY_RATE`` it reads 0). `exhausts_at_us`: when the
allowance left is spent at the rate read now, None if not before the window ends.
`forecast_notice` makes ``limit.forecast`` once per window within a limit's lead;
`with_exhausts_at` tells a ``limit.threshold`` notice the forecast (both count the
maximum in force, not grants).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Final

from metering.domain.notifications import Notice
from metering.domain.state import CounterKey

TAU_SECONDS: Final = 3600
TAU_US: Final = TAU_SECONDS * 1_000_000
FORGET_TAUS: Final = 50
TINY_RATE: Final = 1e-100


def decayed(rate: float, rate_at_us: int, now_us: int) -> float:
    """``rate`` (units per second, as of ``rate_at_us``) read at ``now_us``."""
    if now_us - rate_at_us > FORGET_TAUS * TAU_US or rate < TINY_RATE:
        return 0.0
    if now_us <= rate_at_us:
        return rate
    return rate * math.exp((rate_at_us - now_us) / TAU_US)


def added(rate: float, rate_at_us: int, cost: int, now_us: int) -> tuple[float, int]:
    """The rate and its instant after a write at ``now_us`` that adds ``cost``
    units (negative: a give-back, which adds nothing)."""
    return decayed(rate, rate_at_us, now_us) + max(cost, 0) / TAU_SECONDS, max(rate_at_us, now_us)


def exhausts_at_us(
    used: int, allowance: int, rate: float, now_us: int, window_end_us: int
) -> int | None:
    """When ``allowance - used`` runs out at ``rate`` units per second (read at
    ``now_us``), if that is before ``window_end_us``; None otherwise."""
    left = allowance - used
    if left <= 0:
        return now_us
    if rate <= 0.0:
        return None
    seconds = left / rate
    if seconds * 1_000_000 >= window_end_us - now_us:
        return None
    return now_us + math.ceil(seconds * 1_000_000)


def forecast_notice(
    key: CounterKey,
    maximum: int,
    lead_seconds: int,
    counter: tuple[int, float, int],
    now_us: int,
    event_id: str | None,
) -> Notice | None:
    """``limit.forecast`` for a window whose ``counter`` (used, rate, rate_at_us)
    runs out of ``maximum`` within ``lead_seconds`` of ``now_us``; else None."""
    used, rate, rate_at_us = counter
    at_us = exhausts_at_us(
        used, maximum, decayed(rate, rate_at_us, now_us), now_us, key.window_end_us
    )
    if at_us is None or at_us - now_us > lead_seconds * 1_000_000:
        return None
    return Notice(
        type="limit.forecast",
        mark="forecast",
        limit=key.limit,
        subject=key.subject,
        maximum=maximum,
        used=used,
        window_start_us=key.window_start_us,
        window_end_us=key.window_end_us,
        resets_at_us=key.window_end_us,
        retry_at_us=None,
        event_id=event_id,
        exhausts_at_us=at_us,
    )


def with_exhausts_at(notice: Notice, counter: tuple[int, float, int], now_us: int) -> Notice:
    """``notice`` (of a window) with when its maximum runs out at ``counter``'s rate."""
    used, rate, rate_at_us = counter
    at_us = exhausts_at_us(
        used, notice.maximum, decayed(rate, rate_at_us, now_us), now_us, notice.window_end_us
    )
    return replace(notice, exhausts_at_us=at_us)
