"""The runaway breaker's rule: when a subject's rate runs past a multiple of
its own baseline for long enough, it trips.

A limit's breaker is a factor (``"10x"``: `parse_factor`). A subject keeps,
per limit, a baseline rate (`Baseline`): the same decayed sum as a
counter's rate (`metering.domain.forecast.added`), with a time constant of
a day rather than an hour, across windows, and the instant it was first
charged. `step` adds a charge and reads the subject's recent rate (the
counter's) against ``factor`` times the baseline as it was before the
charge: the first instant it is past starts ``over_since``; past for
`SUSTAIN_US` trips; at or under it clears ``over_since``. A subject with
less than `HISTORY_US` of history never trips, unless the limit sets a
floor: then its baseline reads at least the floor (units per second), and
it may trip from its first charge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final

from metering.domain.forecast import decayed
from metering.errors import InvalidLimit

BASELINE_TAU_SECONDS: Final = 86_400
SUSTAIN_US: Final = 60_000_000  # a minute past the multiple
HISTORY_US: Final = 86_400_000_000  # a day of history
MAX_FACTOR: Final = 1_000
_FACTOR: Final = re.compile(r"[ \t]*([0-9]{1,4})[ \t]*[xX][ \t]*")


def parse_factor(text: object) -> int:
    """``"10x"`` as 10: a whole multiple from 2 to `MAX_FACTOR`."""
    match = _FACTOR.fullmatch(text) if isinstance(text, str) else None
    factor = int(match.group(1)) if match else 0
    if not 2 <= factor <= MAX_FACTOR:
        raise InvalidLimit("breaker", f"give a multiple like '10x', from 2x to {MAX_FACTOR}x")
    return factor


@dataclass(frozen=True, slots=True)
class Baseline:
    """A subject's baseline on one limit: units per second as of ``rate_at_us``,
    first charged at ``since_us``; past the multiple since ``over_since_us``."""

    rate: float
    rate_at_us: int
    since_us: int
    over_since_us: int | None = None


def baseline_added(baseline: Baseline | None, cost: int, now_us: int) -> Baseline:
    """``baseline`` after a charge of ``cost`` units at ``now_us`` (a new one
    starts with it)."""
    if baseline is None:
        return Baseline(max(cost, 0) / BASELINE_TAU_SECONDS, now_us, now_us)
    rate = _decayed(baseline, now_us) + max(cost, 0) / BASELINE_TAU_SECONDS
    return replace(baseline, rate=rate, rate_at_us=max(baseline.rate_at_us, now_us))


def _decayed(baseline: Baseline, now_us: int) -> float:
    # The counter's decay at a day's time constant: scale the gap down 24 times.
    gap_us = max(now_us - baseline.rate_at_us, 0) * 3600 // BASELINE_TAU_SECONDS
    return decayed(baseline.rate, 0, gap_us)


def step(
    baseline: Baseline | None,
    recent_rate: float,
    cost: int,
    now_us: int,
    factor: int,
    floor: float | None = None,
) -> tuple[Baseline, bool]:
    """The baseline after a charge, and whether the breaker trips on it:
    ``recent_rate`` (units per second, the counter's, with this charge) past
    ``factor`` times the baseline before it, for `SUSTAIN_US`."""
    before = _decayed(baseline, now_us) if baseline is not None else 0.0
    after = baseline_added(baseline, cost, now_us)
    young = now_us - after.since_us < HISTORY_US
    if floor is not None:
        before = max(before, floor)
    elif young:
        return replace(after, over_since_us=None), False
    if recent_rate <= factor * before:
        return replace(after, over_since_us=None), False
    since = after.over_since_us if after.over_since_us is not None else now_us
    return replace(after, over_since_us=since), now_us - since >= SUSTAIN_US
