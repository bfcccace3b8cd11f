"""The runaway breaker: a subject whose rate on a limit runs past a multiple of its
own baseline for a minute is quarantined.

A limit's breaker is a factor (``"10x"``: `parse_factor`), an optional floor (units per
second, `parse_floor`) and a quarantine maximum (`quarantine_cap`). A subject keeps per
limit a `Breaker`: a "now" rate (`SHORT_TAU_SECONDS`) and a baseline (`LONG_TAU_SECONDS`),
decayed sums as the counter's rate (`metering.domain.forecast`). `step` adds a charge: past
``factor`` times the baseline for `SUSTAIN_US` without a dip, it trips. Under `HISTORY_US`
of history it never trips, unless a floor is set (the baseline then reads at least the
floor). A quarantined subject is held to its cap until `released` restarts its history.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from metering.errors import InvalidLimit

SHORT_TAU_SECONDS: Final = 60
LONG_TAU_SECONDS: Final = 86_400
SUSTAIN_US: Final = 60_000_000  # a minute past the multiple
HISTORY_US: Final = 86_400_000_000  # a day of history
MAX_FACTOR: Final = 1_000
MAX_FLOOR: Final = 1e12
MAX_CAP: Final = 10**15
FORGET_US: Final = 50 * LONG_TAU_SECONDS * 1_000_000
_FACTOR: Final = re.compile(r"[ \t]*([0-9]{1,4})[ \t]*[xX][ \t]*")


def parse_factor(text: object) -> int:
    """``"10x"`` as 10: a whole multiple from 2 to `MAX_FACTOR`."""
    match = _FACTOR.fullmatch(text) if isinstance(text, str) else None
    factor = int(match.group(1)) if match else 0
    if not 2 <= factor <= MAX_FACTOR:
        raise InvalidLimit(
            "breaker", f"give a multiple like '10x', from 2x to {MAX_FACTOR}x; got {text!r}"
        )
    return factor


def parse_floor(value: object) -> float:
    """A baseline floor in units per second: a number above 0."""
    try:
        floor = float(value) if isinstance(value, str | int | float) else math.nan
    except ValueError:
        floor = math.nan
    if isinstance(value, bool) or not 0 < floor <= MAX_FLOOR:  # NaN fails too
        raise InvalidLimit(
            "breaker_floor", f"give a rate in units per second above 0, like 0.5; got {value!r}"
        )
    return floor


def quarantine_cap(maximum: int, factor: int, chosen: int | None) -> int:
    """What a quarantined subject may use of a window whose maximum in force
    is ``maximum``: ``chosen`` (a whole number from 1) or, by default, the
    maximum divided by the factor (at least 1); never more than the maximum."""
    if chosen is None:
        return max(maximum // factor, 1)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 1 <= chosen <= MAX_CAP:
        raise InvalidLimit("quarantine_max", f"give a whole number of units from 1; got {chosen!r}")
    return min(chosen, maximum)


class Breaker(NamedTuple):
    """A subject's breaker state on one limit, its stored columns in order:
    its now and baseline rates (units per second as of ``rate_at_us``), the
    start of its history, since when the now rate has been past the multiple,
    and since when it is quarantined (None: it is not)."""

    short_rate: float
    long_rate: float
    rate_at_us: int
    since_us: int
    over_since_us: int | None = None
    quarantined_at_us: int | None = None


def breaker_of(columns: Iterable[Any]) -> Breaker:
    """A breaker of its six columns in order (a row's slice: made in C)."""
    return _new(Breaker, columns)


_new: Final[Callable[..., Breaker]] = tuple.__new__


def _decayed(rate: float, gap_us: int, tau_seconds: int) -> float:
    if gap_us <= 0:
        return rate
    if gap_us > FORGET_US:
        return 0.0
    return rate * math.exp(-gap_us / (tau_seconds * 1_000_000))


def rates_at(breaker: Breaker, now_us: int) -> tuple[float, float]:
    """The now rate and the baseline read at ``now_us``."""
    gap = now_us - breaker.rate_at_us
    return (
        _decayed(breaker.short_rate, gap, SHORT_TAU_SECONDS),
        _decayed(breaker.long_rate, gap, LONG_TAU_SECONDS),
    )


def step(
    breaker: Breaker | None, cost: int, now_us: int, factor: int, floor: float | None = None
) -> tuple[Breaker, bool]:
    """The breaker after a charge that consumed ``cost`` at ``now_us``, and
    whether it trips on it (it then reads quarantined from ``now_us``)."""
    stepping = Stepping(breaker, now_us)
    tripped = stepping.charge(cost, now_us, factor, floor)
    return stepping.breaker(), tripped


class Stepping:
    """A breaker stepped in place, charge after charge, as `step` steps it
    (the same floats): a batch's many charges of one pair make no `Breaker`
    each. Made from a breaker (None: none yet, its history from ``now_us``);
    `breaker` reads it back."""

    __slots__ = (
        "long_rate",
        "over_since_us",
        "quarantined_at_us",
        "rate_at_us",
        "short_rate",
        "since_us",
    )

    def __init__(self, breaker: Breaker | None, now_us: int) -> None:
        if breaker is None:
            self.short_rate, self.long_rate = 0.0, 0.0
            self.rate_at_us = self.since_us = now_us
            self.over_since_us: int | None = None
            self.quarantined_at_us: int | None = None
            return
        self.short_rate, self.long_rate = breaker.short_rate, breaker.long_rate
        self.rate_at_us, self.since_us = breaker.rate_at_us, breaker.since_us
        self.over_since_us = breaker.over_since_us
        self.quarantined_at_us = breaker.quarantined_at_us

    def breaker(self) -> Breaker:
        """The breaker as stepped so far."""
        return _new(
            Breaker,
            (
                self.short_rate,
                self.long_rate,
                self.rate_at_us,
                self.since_us,
                self.over_since_us,
                self.quarantined_at_us,
            ),
        )

    def charge(self, cost: int, now_us: int, factor: int, floor: float | None = None) -> bool:
        """Add a charge that consumed ``cost`` at ``now_us``; whether it trips."""
        gap = now_us - self.rate_at_us
        if gap <= 0:  # (a batch's later charges: nothing decays)
            short, before = self.short_rate, self.long_rate
        else:
            short = _decayed(self.short_rate, gap, SHORT_TAU_SECONDS)
            before = _decayed(self.long_rate, gap, LONG_TAU_SECONDS)
            self.rate_at_us = now_us
        added = cost if cost > 0 else 0
        self.short_rate = short_rate = short + added / SHORT_TAU_SECONDS
        self.long_rate = before + added / LONG_TAU_SECONDS
        if self.quarantined_at_us is not None:
            return False
        if floor is not None:
            before = max(before, floor)
        elif now_us - self.since_us < HISTORY_US:
            self.over_since_us = None
            return False
        bound = factor * before
        if short_rate <= bound:
            self.over_since_us = None
            return False
        # Past the bound since ``over_since`` only if it stayed past it until this
        # charge: between charges the now rate only decays, lowest just before it.
        over = self.over_since_us
        since = over if over is not None and short > bound else now_us
        if now_us - since >= SUSTAIN_US:
            self.over_since_us, self.quarantined_at_us = None, now_us
            return True
        self.over_since_us = since
        return False


def runs(
    states: Mapping[tuple[str, str], Breaker],
    charged: Mapping[tuple[str, str], Iterable[int]],
    now_us: int,
    settings: Mapping[str, tuple[int, float | None]],
) -> dict[tuple[str, str], Breaker]:
    """Each (limit, subject) breaker of ``states`` (none: a new one) after
    the charges that consumed its ``charged`` costs in turn, all at
    ``now_us``, each `steady` at ``now_us`` (none can trip it), by its
    limit's factor and floor (``settings``): the floats `step` makes charge
    after charge, a pair's in one loop."""
    found = {}
    for pair, costs in charged.items():
        factor, floor = settings[pair[0]]
        breaker = states.get(pair)
        if breaker is None:
            short, long, at_us, since_us, over = 0.0, 0.0, now_us, now_us, None
        else:
            short, long = rates_at(breaker, now_us)
            at_us, since_us, over = (
                max(breaker.rate_at_us, now_us),
                breaker.since_us,
                breaker.over_since_us,
            )
        young = floor is None and now_us - since_us < HISTORY_US
        for cost in costs:
            added = cost if cost > 0 else 0
            was, before = short, long
            short = was + added / SHORT_TAU_SECONDS
            long = before + added / LONG_TAU_SECONDS
            if young:
                over = None
                continue
            bound = factor * (before if floor is None else max(before, floor))
            if short <= bound:
                over = None
            elif over is None or not was > bound:  # (as `Stepping.charge` keeps ``over``)
                over = now_us
        found[pair] = _new(Breaker, (short, long, at_us, since_us, over, None))
    return found


def steady(breaker: Breaker | None, now_us: int) -> bool:
    """Whether no charge at ``now_us`` can trip ``breaker`` nor meet its
    quarantine: `step` trips only a breaker past the multiple since
    `SUSTAIN_US` before, and a charge that finds it past it since later
    (or not past it) keeps that start or takes ``now_us``."""
    if breaker is None:
        return True
    since = breaker.over_since_us
    return breaker.quarantined_at_us is None and (since is None or now_us - since < SUSTAIN_US)


def released(breaker: Breaker, now_us: int) -> Breaker:
    """``breaker`` after a release at ``now_us``: not quarantined, its now rate
    forgotten and its history starting again (it cannot trip at once)."""
    _, baseline = rates_at(breaker, now_us)
    return Breaker(0.0, baseline, max(breaker.rate_at_us, now_us), now_us)
