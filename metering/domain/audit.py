"""The ledger's invariants, judged: pure rules, no SQL, no clock.

A window's *ledger sum* is the cost of its consumed charges (a shadow would-deny consumed
nothing) less what voids reversed and cancels gave back, counting only what came after its
last reset (a result by the reset clock's tick, a void or give-back by time); a commit of
more than was reserved rewrote its result, overdraft included (one of fewer priced units:
its spend charges, at the money kept). `Tally` adds these up from
ledger rows, from what an earlier run kept; the `judge_*` functions return a `Violation`
naming what broke, or None. Gauges (levels) and token buckets (no window) are not summed.
A seat window's ``used`` is its values holding a seat, which every live event's value holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from metering.domain.distinct import value_of
from metering.domain.instants import from_us
from metering.domain.rollups import CONSUMED, WOULD_DENY
from metering.errors import MeteringError

# (subject, limit, window start in microseconds).
WindowKey = tuple[str, str, int]
# A window and one of its seat values.
SeatValue = tuple[str, str, int, str]

# The fields of a ledger row (`ChargeDecision.to_row`) the audit reads.
_SUBJECT, _LIMIT, _COST, _ALLOWED, _OUTCOME, _MAXIMUM, _OVERAGE, _WINDOW = 0, 1, 2, 3, 4, 7, 8, 9
_PRICE: Final = 13


class Invariant(StrEnum):
    """What the audit checks; members equal their values."""

    ONE_RESULT = "one_result"  # every reservation, void and overdraft has its event's result
    COUNTER_LEDGER = "counter_ledger"  # a counter equals its window's ledger sum
    HARD_MAXIMUM = "hard_maximum"  # hard usage within maximum + grants drawn + overdraft
    GRANT_BALANCE = "grant_balance"  # 0 <= used <= amount, and the draws within both
    SPEND_PRICED = "spend_priced"  # a spend charge and counter equal the priced amounts
    SEAT_HELD = "seat_held"  # a seat counter is its held values; a live event's value holds one
    ROLLUP_LEDGER = "rollup_ledger"  # a rollup row (by dimension, or spend) is its results'
    RESERVATION_UNRESOLVED = "reservation_unresolved"  # held past TTL + sweep interval
    CHECKOUT_UNRESOLVED = "checkout_unresolved"  # held past TTL + sweep interval
    DELIVERY_STUCK = "delivery_stuck"  # a webhook delivery pending long past its schedule
    QUEUE_UNDECIDED = "queue_undecided"  # a queued event older than the bound, no result


INVARIANTS: Final[tuple[str, ...]] = tuple(i.value for i in Invariant)


@dataclass(frozen=True, slots=True)
class Violation:
    """One invariant broken: by what (subject, limit, window, or ``item``: an
    event, grant, reservation or delivery id), what the ledger says
    (``expected``) and what was found."""

    invariant: Invariant
    subject: str | None = None
    limit: str | None = None
    window_start_us: int | None = None
    expected: str = ""
    found: str = ""
    item: str | None = None

    def to_dict(self) -> dict[str, Any]:
        window = self.window_start_us
        return {
            "invariant": self.invariant.value,
            "subject": self.subject,
            "limit": self.limit,
            "window_start": from_us(window).isoformat() if window else None,
            "item": self.item,
            "expected": self.expected,
            "found": self.found,
        }


@dataclass(slots=True)
class WindowLedger:
    """A window's ledger sum, and the largest maximum in force its charges saw
    (a soft limit's overage past it included)."""

    used: int = 0
    maximum: int = 0


class Tally:
    """Ledger sums per window, from ``start`` (an earlier run's) on.

    Give it the resets first (`reset`), then results, voids and give-backs
    in any order: a reset empties its window's sum, and what came before it
    is left out by tick (results) or by time (voids, give-backs).
    """

    def __init__(self, start: Mapping[WindowKey, WindowLedger] | None = None) -> None:
        self.windows: dict[WindowKey, WindowLedger] = {
            key: WindowLedger(ledger.used, ledger.maximum) for key, ledger in (start or {}).items()
        }
        self.touched: set[WindowKey] = set()
        self._reset_tick: dict[WindowKey, int] = {}
        self._reset_at_us: dict[WindowKey, int] = {}

    def _window(self, key: WindowKey) -> WindowLedger:
        self.touched.add(key)
        return self.windows.setdefault(key, WindowLedger())

    def reset(self, key: WindowKey, tick: int, at_us: int) -> None:
        ledger = self._window(key)
        if tick >= self._reset_tick.get(key, -1):
            self._reset_tick[key] = tick
            self._reset_at_us[key] = max(at_us, self._reset_at_us.get(key, at_us))
            ledger.used = 0

    def add_result(self, outcome: str, reset_tick: int, charges: Sequence[Sequence[Any]]) -> None:
        for key, cost, maximum in consumed(outcome, charges):
            if reset_tick < self._reset_tick.get(key, -1):
                continue  # cleared by a reset written after it
            ledger = self._window(key)
            ledger.used += cost
            ledger.maximum = max(ledger.maximum, maximum)

    def add_units(
        self,
        key: WindowKey,
        units: int,
        at_us: int,
        result_tick: int | None = None,
        maximum: int = 0,
    ) -> None:
        """Units a commit at ``at_us`` that rewrote a result added to its charge (fewer: a
        spend charge whose priced units went back): none when a reset of the window came
        after the commit. ``result_tick``: the result is read in this tally too, and counts
        them itself unless a reset cleared it (then the units count, made after it, at the
        charge's ``maximum``)."""
        if at_us < self._reset_at_us.get(key, at_us):
            return
        if result_tick is not None and result_tick >= self._reset_tick.get(key, -1):
            return
        ledger = self._window(key)
        ledger.used += units
        ledger.maximum = max(ledger.maximum, maximum)

    def copy(self) -> Tally:
        """An independent copy (resets remembered, nothing touched yet)."""
        twin = Tally(self.windows)
        twin._reset_tick = dict(self._reset_tick)
        twin._reset_at_us = dict(self._reset_at_us)
        return twin

    def take_back(self, key: WindowKey, units: int, at_us: int) -> None:
        """A void or a give-back of ``units`` at ``at_us`` (none before a reset of the window)."""
        if at_us < self._reset_at_us.get(key, at_us):
            return
        self._window(key).used -= units


def consumed(
    outcome: str, charges: Iterable[Sequence[Any]]
) -> Iterable[tuple[WindowKey, int, int]]:
    """Each charge of a result that consumed from a window: its window, cost
    and the most it let the window hold (its maximum, plus the overage past
    it a soft limit allowed: a limit made hard since keeps what it let in)."""
    if outcome not in CONSUMED:
        return
    for row in charges:
        if not row[_ALLOWED] or row[_OUTCOME] == WOULD_DENY or not row[_WINDOW]:
            continue
        key = (str(row[_SUBJECT]), str(row[_LIMIT]), int(row[_WINDOW]))
        yield key, int(row[_COST]), int(row[_MAXIMUM]) + int(row[_OVERAGE])


def spend_violations(
    event_id: str, outcome: str, charges: Sequence[Sequence[Any]], currencies: Mapping[str, str]
) -> list[Violation]:
    """A consumed result's spend charges (limits of ``currencies``: name to
    currency) that do not equal the sum of their subject's priced amounts in
    their currency."""
    if outcome not in CONSUMED:
        return []
    priced: dict[tuple[str, str], int] = {}
    for row in charges:
        if len(row) > _PRICE and row[_PRICE] is not None and row[_OUTCOME] != WOULD_DENY:
            currency, amount = row[_PRICE]
            key = (str(row[_SUBJECT]), str(currency))
            priced[key] = priced.get(key, 0) + int(amount)
    found = []
    for row in charges:
        currency = currencies.get(str(row[_LIMIT]))
        if currency is None:
            continue
        owed = priced.get((str(row[_SUBJECT]), currency), 0)
        if int(row[_COST]) != owed:
            found.append(
                Violation(
                    Invariant.SPEND_PRICED,
                    str(row[_SUBJECT]),
                    str(row[_LIMIT]),
                    int(row[_WINDOW]) if row[_WINDOW] else None,
                    expected=f"{owed} {currency} priced",
                    found=f"{row[_COST]} charged",
                    item=event_id,
                )
            )
    return found


def judge_counter(key: WindowKey, ledger: int, used: int, *, spend: bool) -> Violation | None:
    """A counter's ``used`` against its window's ledger sum (a spend limit's
    is its priced results')."""
    if used == ledger:
        return None
    invariant = Invariant.SPEND_PRICED if spend else Invariant.COUNTER_LEDGER
    return Violation(invariant, *key, expected=f"used {ledger}", found=f"used {used}")


def judge_hard(
    key: WindowKey, used: int, maximum: int, drawn: int, overdraft: int
) -> Violation | None:
    """A hard window's usage against the largest maximum in force its charges
    saw (a soft one's overage included), plus what it drew on grants and the
    overdraft commits recorded."""
    bound = maximum + drawn + overdraft
    if used <= bound:
        return None
    return Violation(
        Invariant.HARD_MAXIMUM,
        *key,
        expected=f"used <= {bound} (maximum {maximum} + grants {drawn} + overdraft {overdraft})",
        found=f"used {used}",
    )


def judge_grant(
    grant_id: str, subject: str, limit: str, amount: int, used: int, drawn: int
) -> Violation | None:
    """A grant's balance: ``used`` within 0 and ``amount``, and what windows
    still hold drawn on it (``drawn``) within both (a reset forgets draws, so
    ``drawn`` may be less than ``used``, never more)."""
    if 0 <= used <= amount and drawn <= used:
        return None
    return Violation(
        Invariant.GRANT_BALANCE,
        subject,
        limit,
        expected=f"0 <= drawn {drawn} <= used <= amount {amount}",
        found=f"used {used}, balance {amount - max(used, drawn)}",
        item=grant_id,
    )


def seat_windows(
    outcome: str, charges: Sequence[Sequence[Any]], distinct: Mapping[str, str]
) -> list[WindowKey]:
    """The seat limits' windows (``distinct``: limit name to key) a result consumed in."""
    return [key for key, _, _ in consumed(outcome, charges) if key[1] in distinct]


def live_values(
    event_id: str,
    windows: Iterable[WindowKey],
    metadata: Mapping[str, Any] | None,
    distinct: Mapping[str, str],
    cleared_below: Mapping[WindowKey, int],
    reset_tick: int,
) -> list[tuple[SeatValue, str]]:
    """The seat values an unvoided result's charges count, with its id: none in
    a window a reset cleared after it (a tick in ``cleared_below`` above its
    ``reset_tick``), nor where its metadata carries no value (decided before
    the limit counted values)."""
    found = []
    for key in windows:
        if reset_tick < cleared_below.get(key, -1):
            continue
        try:
            value = value_of(distinct[key[1]], key[1], metadata, 1)
        except MeteringError:
            continue
        found.append(((*key, value), event_id))
    return found


def judge_seats(key: WindowKey, used: int, held: int, unheld: Mapping[str, str]) -> list[Violation]:
    """A seat window: its counter's ``used`` against its ``held`` values, and
    each value of a live event that holds no seat (``unheld``: value to event id)."""
    found = []
    if used != held:
        found.append(
            Violation(
                Invariant.SEAT_HELD,
                *key,
                expected=f"used {held} (values holding a seat)",
                found=f"used {used}",
            )
        )
    for value, event_id in sorted(unheld.items()):
        found.append(
            Violation(
                Invariant.SEAT_HELD,
                *key,
                expected=f"value {value!r} holds a seat (a live event counts it)",
                found="no seat",
                item=event_id,
            )
        )
    return found
