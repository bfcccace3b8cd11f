"""Entitlements and grants: a subject's own allowance, and what tops it up (docs/allowances.md).

An *entitlement* gives one subject its own maximum for a limit from ``effective_from`` on;
the maximum at an instant is the latest change at or before it, else the limit's default
(`maximum_at`), and a change to None returns to the default while the history stays.
A *grant* adds usage on top of the maximum, active from ``effective_from`` until
``expires_at`` (exclusive; never when None). A fixed-window charge draws on the window's own
allowance first, then on active grants by priority (lowest first, `DEFAULT_PRIORITY`
unless given), then earliest expiry, earliest given, id; an expired grant's rest is gone.
`fit_window` is that arithmetic, shared by `windows.evaluate_window` and `rules.decide`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from metering.domain.bounds import validate_whole
from metering.domain.events import validate_event_id
from metering.domain.instants import from_us

MAX_GRANT: Final = 10**15
NEVER: Final = 2**62  # an expiry later than any instant: sorts grants without one last
# Grants are drawn by priority, the lowest number first, then by expiry.
DEFAULT_PRIORITY: Final = 100
MAX_PRIORITY: Final = 1000


def validate_grant_id(grant_id: object, field_name: str = "grant_id") -> str:
    """A grant (or correction) id: the rule of event ids."""
    return validate_event_id(grant_id, field_name)


def validate_amount(field_name: str, value: object, ceiling: int = MAX_GRANT) -> int:
    return validate_whole(field_name, value, 1, ceiling)


def validate_priority(value: object) -> int:
    return validate_whole("priority", value, 0, MAX_PRIORITY)


# -- entitlements ---------------------------------------------------------------

# One subject's changes of maximum: sorted (effective_from_us, maximum or None).
History = tuple[tuple[int, int | None], ...]
# A default maximum: a limit's (an int), or none (a token bucket's history).
D = TypeVar("D", bound=int | None)


def maximum_at(history: History | None, default: D, at_us: int) -> int | D:
    """The maximum that applies at ``at_us``: the latest change at or before it
    (``default`` before the first, and where a change returns to it)."""
    if not history:
        return default
    if history[-1][0] <= at_us:  # (most: the last change is in force)
        found = history[-1][1]
        return default if found is None else found
    index = bisect.bisect_right(history, at_us, key=lambda change: change[0])
    if index == 0:
        return default
    found = history[index - 1][1]
    return default if found is None else found


@dataclass(frozen=True, slots=True)
class Entitlement:
    """One change of a subject's maximum for a limit (``maximum`` None: back to the default)."""

    subject: str
    limit: str
    maximum: int | None
    effective_from_us: int
    created_at_us: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "limit": self.limit,
            "maximum": self.maximum,
            "effective_from": from_us(self.effective_from_us).isoformat(),
            "created_at": from_us(self.created_at_us).isoformat(),
        }


# -- grants ---------------------------------------------------------------------


@dataclass(slots=True)
class Balance:
    """A grant as a charge sees it: mutable, so a batch draws on it event after event."""

    grant_id: str
    amount: int
    used: int
    effective_from_us: int
    expires_at_us: int | None
    priority: int = DEFAULT_PRIORITY

    def active_at(self, at_us: int) -> bool:
        expires = self.expires_at_us
        return self.effective_from_us <= at_us and (expires is None or at_us < expires)

    @property
    def left(self) -> int:
        return self.amount - self.used

    def order(self) -> tuple[int, int, int, str]:
        expires = NEVER if self.expires_at_us is None else self.expires_at_us
        return (self.priority, expires, self.effective_from_us, self.grant_id)


@dataclass(slots=True)
class Pot:
    """The grants of one subject and limit, and what one window drew on them.

    ``granted`` maps a window start to the usage of that window paid by
    grants: the window's own usage is its counter's ``used`` minus it.
    """

    balances: list[Balance]
    granted: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.balances) > 1:  # (most pots hold one grant: nothing to sort)
            self.balances.sort(key=Balance.order)

    def available(self, at_us: int) -> int:
        total = 0
        for b in self.balances:  # (`Balance.active_at` and `left`, inlined: once a charge)
            left = b.amount - b.used
            expires = b.expires_at_us
            if left > 0 and b.effective_from_us <= at_us and (expires is None or at_us < expires):
                total += left
        return total

    def plan(self, amount: int, at_us: int) -> list[tuple[str, int]]:
        """Which grants pay ``amount``: by priority, then earliest expiring first
        (as much as they hold)."""
        draws: list[tuple[str, int]] = []
        for balance in self.balances:
            if amount <= 0:
                break
            if balance.active_at(at_us) and balance.left > 0:
                taken = min(balance.left, amount)
                draws.append((balance.grant_id, taken))
                amount -= taken
        return draws

    def draw(self, window_start_us: int, amount: int, at_us: int) -> tuple[int, list[list[Any]]]:
        """What the grants active at ``at_us`` held before, and ``amount``
        paid and recorded in this window, as `plan` then `take` would
        (the draws as [grant id, amount] lists), in one pass."""
        available = 0
        draws: list[list[Any]] = []
        paid = 0
        for b in self.balances:  # (`Balance.active_at` and `left`, inlined: once a charge)
            left = b.amount - b.used
            expires = b.expires_at_us
            if left > 0 and b.effective_from_us <= at_us and (expires is None or at_us < expires):
                available += left
                if amount > 0:
                    taken = left if left < amount else amount
                    b.used += taken
                    draws.append([b.grant_id, taken])
                    amount -= taken
                    paid += taken
        if paid:
            self.granted[window_start_us] = self.granted.get(window_start_us, 0) + paid
        return available, draws

    def take(self, window_start_us: int, draws: Sequence[tuple[str, int]]) -> None:
        """Record ``draws`` (from `plan`) as paid, in this window."""
        by_id = {b.grant_id: b for b in self.balances}
        for grant_id, amount in draws:
            by_id[grant_id].used += amount
            self.granted[window_start_us] = self.granted.get(window_start_us, 0) + amount


def used_by_grant(pots: Iterable[Pot]) -> dict[str, int]:
    """What each grant of ``pots`` has used, by grant id (`drawn_since`)."""
    return {b.grant_id: b.used for pot in pots for b in pot.balances}


def drawn_since(
    pots: Mapping[tuple[str, str], Pot], used: Mapping[str, int]
) -> dict[tuple[str, str, int, str], int] | None:
    """What ``pots`` (by (limit, subject)) drew since their grants had ``used``
    (`used_by_grant`; a grant not in it had used nothing), by (limit,
    subject, window start, grant id), as the draws of the charges' rows sum
    to: each pot draws only in its windows (``granted``), so a pot that drew
    and knows one window drew in it. None when one that drew knows more
    (the rows tell which window drew what)."""
    found: dict[tuple[str, str, int, str], int] = {}
    for (name, subject), pot in pots.items():
        for balance in pot.balances:
            grant_id = balance.grant_id
            drawn = balance.used - used.get(grant_id, 0)
            if drawn:
                granted = pot.granted
                if len(granted) != 1:
                    return None
                for start in granted:
                    found[(name, subject, start, grant_id)] = drawn
    return found


@dataclass(frozen=True, slots=True)
class WindowFit:
    """A fixed-window charge against its own allowance and its grants.

    ``fits`` is the hard verdict (a soft limit consumes whatever it says);
    ``draws`` the grants that pay, when it is consumed; ``remaining_*``
    count the own allowance left and the active grants.
    """

    fits: bool
    draws: tuple[tuple[str, int], ...]
    remaining_before: int
    remaining_after: int
    overage_after: int
    overage_before: int


def fit_window(
    maximum: int, used: int, granted: int, cost: int, pot: Pot, at_us: int, *, soft: bool
) -> WindowFit:
    """Usage draws on the window's own allowance (``maximum`` less its own
    usage, ``used - granted``) first, then on the grants active at ``at_us``;
    what neither pays is overage on a soft limit and a denial on the others.

    Grants add room over the maximum in force, never over usage already past
    it: a hard window whose own usage is above its maximum (a downgrade) has
    no room at all, so ``used`` never passes ``maximum`` plus what grants paid.
    """
    own_used = used - granted
    own_room = maximum - own_used if own_used < maximum else 0
    available = pot.available(at_us)
    room = own_room + available if soft or own_used <= maximum else 0
    fits = cost <= room
    wanted = cost - own_room if cost > own_room else 0
    draws = tuple(pot.plan(wanted, at_us)) if fits or soft else ()
    drawn = sum(amount for _, amount in draws)
    own_after = own_used + cost - drawn
    return WindowFit(
        fits=fits,
        draws=draws,
        remaining_before=room,
        remaining_after=max(room - cost, 0),
        overage_after=own_after - maximum if own_after > maximum else 0,
        overage_before=own_used - maximum if own_used > maximum else 0,
    )


__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "Balance",
    "Entitlement",
    "History",
    "Pot",
    "WindowFit",
    "drawn_since",
    "fit_window",
    "maximum_at",
    "used_by_grant",
    "validate_amount",
    "validate_grant_id",
    "validate_priority",
]
