"""The counter rate's SQL (`metering.domain.forecast`), one text for every
writer of counters, PostgreSQL and SQLite alike.

`rate_set` is the ``rate = ..., rate_at_us = ...`` of an UPDATE (or an
upsert's DO UPDATE) that sets ``used`` to ``new_used`` at ``now``: the
expressions read the row's old ``rate``, ``rate_at_us`` and ``used``, so
the rate moves in the same statement as the counter. A new row's rate is
`created_rate`, written as a value.
"""

from __future__ import annotations

import re
from operator import itemgetter
from typing import Final

from metering.domain.forecast import FORGET_TAUS, TAU_SECONDS, TAU_US, TINY_RATE

_RATE: Final = f"""rate = CASE
        WHEN {{now}} - {{row}}rate_at_us > {FORGET_TAUS * TAU_US} OR {{row}}rate < {TINY_RATE!r}
            THEN 0.0
        WHEN {{now}} <= {{row}}rate_at_us THEN {{row}}rate
        ELSE {{row}}rate * exp(CAST({{row}}rate_at_us - {{now}} AS DOUBLE PRECISION) / {TAU_US})
    END + CASE WHEN {{new}} > {{row}}used
        THEN CAST({{new}} - {{row}}used AS DOUBLE PRECISION) / {TAU_SECONDS} ELSE 0.0 END,
    rate_at_us = CASE WHEN {{now}} > {{row}}rate_at_us THEN {{now}} ELSE {{row}}rate_at_us END"""

# The order ``now`` and ``new`` appear in `_RATE`, for positional placeholders.
_ORDER: Final = tuple(re.findall(r"\{(now|new)\}", _RATE))
# Picks them out of (new, now) in that order, in one call (a counter's row each).
_PICK: Final = itemgetter(*[1 if name == "now" else 0 for name in _ORDER])


def rate_set(*, now: str, new_used: str, row: str = "") -> str:
    """``rate = ..., rate_at_us = ...`` with ``now`` and ``new_used`` as SQL
    (named parameters or columns); ``row`` qualifies the old row's columns
    (``"c."``, ``"counters."``)."""
    return _RATE.format(now=now, new=new_used, row=row)


def positional_rate_set(placeholder: str) -> str:
    """`rate_set` with a positional placeholder for each use; its values are
    `positional_rate_values`."""
    return _RATE.replace("{now}", "{p}").replace("{new}", "{p}").format(p=placeholder, row="")


def positional_rate_values(new_used: int, now_us: int) -> tuple[int, ...]:
    found: tuple[int, ...] = _PICK((new_used, now_us))
    return found


def created_rate(used: int) -> float:
    """A new counter's rate: what it was created with, as one write."""
    return max(used, 0) / TAU_SECONDS
