"""A limit's default maximum and enforcement over time: what a report of a past window applies.

A limit's definitions are a list of `Definition`, one per change of its maximum or enforcement
(its first definition too), oldest first. The one in force at an instant is the latest starting
at or before it, as for entitlements; before the first, the first (a late event can land in a
window that ended before the limit was defined: it was decided by that definition). A report
takes the one in force at a window's last instant (`in_force`, at ``window_end_us - 1``): the
decisions after a mid-window change used it. The storage writes a change only when the
maximum or enforcement differs from the latest (`changed`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Definition:
    """A limit's default ``maximum`` and ``enforcement`` from ``effective_from_us`` on."""

    effective_from_us: int
    maximum: int
    enforcement: str


def in_force(history: Sequence[Definition], at_us: int) -> Definition | None:
    """The definition of ``history`` (oldest first) in force at ``at_us``: the
    latest starting at or before it, else the first; None without any."""
    if not history:
        return None
    index = bisect.bisect_right(history, at_us, key=_start)
    return history[max(index - 1, 0)]


def default_at(history: Sequence[Definition], today: int | None, at_us: int) -> int | None:
    """The default maximum in force at ``at_us``; ``today`` without a history
    or for a limit without a maximum (None: a token bucket's)."""
    found = in_force(history, at_us)
    return today if found is None or today is None else found.maximum


def changed(history: Sequence[Definition], maximum: int, enforcement: str) -> bool:
    """Whether a definition with ``maximum`` and ``enforcement`` is a change of
    ``history`` (its latest differs, or it has none)."""
    if not history:
        return True
    latest = history[-1]
    return (latest.maximum, latest.enforcement) != (maximum, enforcement)


def _start(definition: Definition) -> int:
    return definition.effective_from_us
