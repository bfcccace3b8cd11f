"""Priced charges on the reference engine: what an event adds to spend limits.

`Money.read` looks up, for a batch, the prices of the limits it charges;
when none is priced (the usual batch) it is None and nothing else is read.
Otherwise `Money.expand` adds to each event one charge per subject and
spend limit of the price's currency, of the sum of its priced charges'
amounts in force at the event's time (`metering.domain.money`), so the
pure `decide_event` stacks them with the event's own charges: all or
nothing, in the same transaction. A charge that would cost more than the
largest amount makes its event unacceptable (`Money.refusal`), as a bad
time does. The fast path does the same with every price and spend limit
cached with the limits (`Pricing`, kept by `metering.engine.limit_cache.LimitCache`).

A tiered price or a flat fee (`Price.counted`) charges by what its window
held before the event: the event carries its spend charges from the start
(0 kept), and each path prices them again at decision time with the
counters it decides with (`repriced`), so a batch's events each see the
totals the ones before them left.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Final

from metering.domain.events import Charge, UsageEvent
from metering.domain.kinds import prices_taken
from metering.domain.limits import Limit
from metering.domain.money import (
    Price,
    PricedCharge,
    PriceHistory,
    price_at,
    priced_charges,
    spend_charges,
)
from metering.domain.rules import Rule
from metering.errors import InvalidInput
from metering.storage.prices import PriceStore
from metering.storage.store import Store


@dataclass(frozen=True, slots=True)
class Money:
    """The batch's prices, and the spend limits by currency."""

    prices: Mapping[str, PriceHistory]
    spend: Mapping[str, Sequence[str]]
    limits: dict[str, Limit]

    @classmethod
    def read(
        cls, store: Store, events: Sequence[UsageEvent], limits: Mapping[str, Limit]
    ) -> Money | None:
        """None when no charge of ``events`` is on a priced limit."""
        found = PriceStore(store.connection)
        prices = taken(found.histories(c.limit for e in events for c in e.charges), limits)
        if not prices:
            return None
        spend = found.spend_limits()
        names = [name for group in spend.values() for name in group]
        return cls(prices, spend, {**limits, **store.load_limits(names)})

    def expand(self, event: UsageEvent) -> UsageEvent:
        """``event`` with its charges of the subjects' spend limits after its own."""
        priced = priced_charges(event.charges, self.prices, event.occurred_at_us)
        extra = spend_charges(priced, self.spend)
        if not extra:
            return event
        return replace(event, charges=(*event.charges, *(Charge(*c) for c in extra)))

    def refusal(self, event: UsageEvent) -> InvalidInput | None:
        """The error of a charge of ``event`` that would cost too much, if any."""
        try:
            priced_charges(event.charges, self.prices, event.occurred_at_us)
        except InvalidInput as exc:
            return exc
        return None

    def priced(self, event: UsageEvent) -> dict[int, tuple[str, int]]:
        """Each priced charge's (currency, amount), by its position in ``event``."""
        found = priced_charges(event.charges, self.prices, event.occurred_at_us)
        return {c.index: (c.currency, c.amount) for c in found}

    def counted(self, event: UsageEvent) -> bool:
        return is_counted(self.prices, event.charges, event.occurred_at_us)

    def repriced(
        self, event: UsageEvent, used: Sequence[int]
    ) -> tuple[dict[int, tuple[str, int]], list[int | None]]:
        """Each priced charge's (currency, amount) with its counters at
        ``used``, and per charge of the expanded ``event`` a spend charge's
        amount (None for the event's own charges)."""
        found, costs = repriced(self.prices, self.spend, event.charges, event.occurred_at_us, used)
        return {c.index: (c.currency, c.amount) for c in found}, costs


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Every limit's prices and the spend limits by currency, read at ``version``
    of the limits: what the fast path prices events with (as `Money` does)."""

    version: int = -1
    prices: Mapping[str, PriceHistory] = field(default_factory=dict)
    spend: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, store: PriceStore, version: int, limits: Mapping[str, Limit]) -> PriceBook:
        return cls(version, taken(store.histories(), limits), store.spend_limits())

    def charges(
        self, charges: Sequence[tuple[str, str, int]], at_us: int
    ) -> tuple[list[PricedCharge], list[Charge]]:
        """The priced charges among ``charges`` at ``at_us`` and the spend
        charges they add (`Money.expand`); `InvalidInput` for one that would
        cost too much (`Money.refusal`)."""
        priced = priced_charges(charges, self.prices, at_us)
        return priced, [Charge(*c) for c in spend_charges(priced, self.spend)]


def taken(
    histories: Mapping[str, PriceHistory], limits: Mapping[str, Limit]
) -> dict[str, PriceHistory]:
    """The limits' prices that price their charges (`prices_taken`), the unpriced left out."""
    found = {name: prices_taken(limits.get(name), history) for name, history in histories.items()}
    return {name: history for name, history in found.items() if history}


FOREVER_US: Final = 1 << 80  # past any instant in microseconds
# What pricing an event's charges gives (`Pricing.expand`): its priced charges'
# (currency, amount) by position; whether one is counted and, when it is its
# one priced charge, (its position, its price); its charges with its spend
# charges after its own; and those spend charges' rules.
Expanded = tuple[
    dict[int, tuple[str, int]], bool, tuple[int, Price] | None, tuple[Charge, ...], list[Rule]
]


class Pricing:
    """A version's `PriceBook` and ``rules``, worked out when the limits cache
    loads and kept with it: what pricing an event's charges gives, remembered
    across batches and calls (`expand`). An event at or after ``settled_us``
    (every limit's last price in force) is remembered by its charges; an
    earlier one by its charges' limits, costs and the prices in force then.
    Shared by a process's threads: entries are added whole, never changed;
    all are forgotten past ``size``."""

    def __init__(self, book: PriceBook, rules: Mapping[str, Rule], size: int = 100_000) -> None:
        self.book, self.rules, self.size = book, rules, size
        starts = [price.effective_from_us for history in book.prices.values() for price in history]
        self.settled_us = max(starts, default=-FOREVER_US)
        self.events: dict[tuple[Charge, ...], Expanded] = {}
        # By the charges' (limit, cost, price in force), without their subjects:
        # as `expand`'s but with the spend charges alone (the first subject's).
        self.priced: dict[tuple[object, ...], Expanded] = {}
        # Per priced limit, the id of the price last found in force and the
        # times it is in force over: [from, until).
        self.in_force: dict[str, tuple[int, int, int]] = {}
        # A subject's own spend charges, by subject and ``priced``'s key.
        self.extras: dict[tuple[str, tuple[object, ...]], tuple[Charge, ...]] = {}

    def expand(self, charges: tuple[Charge, ...], at_us: int) -> Expanded | None:
        """What ``charges`` give at ``at_us`` (`Money.expand`); None when a
        spend limit they add is not in ``rules`` (created between the reads
        of a refresh); `InvalidInput` for a charge that costs too much."""
        settled = at_us >= self.settled_us
        if settled:
            known = self.events.get(charges)
            if known is not None:
                return known
        found = self._found(charges, at_us)
        if found is None:
            return None
        amounts, is_counted, counted, extra, added = found
        expanded = (amounts, is_counted, counted, (*charges, *extra) if extra else charges, added)
        if settled:
            if len(self.events) >= self.size:
                self.events.clear()
            self.events[charges] = expanded
        return expanded

    def _found(self, charges: tuple[Charge, ...], at_us: int) -> Expanded | None:
        """`expand`'s, with the spend charges alone."""
        # What pricing ``charges`` gives depends on their limits and costs and
        # the prices in force only (the spend charges of an event of one
        # subject are that subject's): events mostly repeat them.
        prices = self.book.prices
        key: tuple[object, ...]
        subject = charges[0][0]
        alike = all(charge[0] == subject for charge in charges)
        key = tuple(
            [
                (name, cost, self._in_force(name, at_us) if name in prices else 0)
                for _, name, cost in charges
            ]
        )
        if not alike:
            key = (charges, key)
        found = self.priced.get(key)
        if found is None:
            found = self._priced(charges, at_us)
            if found is None:
                return None
            if len(self.priced) >= self.size:
                self.priced.clear()
            self.priced[key] = found
        amounts, is_counted, counted, extra, added = found
        if alike and extra and extra[0].subject != subject:
            mine = self.extras.get((subject, key))
            if mine is None:
                mine = tuple(Charge(subject, charge.limit, charge.cost) for charge in extra)
                if len(self.extras) >= self.size:
                    self.extras.clear()
                self.extras[(subject, key)] = mine
            return amounts, is_counted, counted, mine, added
        return found

    def _in_force(self, name: str, at_us: int) -> int:
        """The id of priced limit ``name``'s `price_at` ``at_us``."""
        found = self.in_force.get(name)
        if found is not None and found[0] <= at_us < found[1]:
            return found[2]
        history = self.book.prices[name]
        index = bisect_right(history, at_us, key=attrgetter("effective_from_us"))
        since = history[index - 1].effective_from_us if index else -FOREVER_US
        until = history[index].effective_from_us if index < len(history) else FOREVER_US
        ident = id(price_at(history, at_us))
        self.in_force[name] = (since, until, ident)
        return ident

    def _priced(self, charges: tuple[Charge, ...], at_us: int) -> Expanded | None:
        """What `expand` adds to ``charges`` at ``at_us``."""
        priced, extra = self.book.charges(charges, at_us)
        amounts = {c.index: (c.currency, c.amount) for c in priced}
        counted: tuple[int, Price] | None = None
        is_counted = any(c.counted for c in priced)
        if is_counted and len(priced) == 1:
            _, limit, _ = charges[priced[0].index]
            price = price_at(self.book.prices[limit], at_us)
            assert price is not None
            counted = (priced[0].index, price)
        added: list[Rule] = []
        for charge in extra:
            rule = self.rules.get(charge.limit)
            if rule is None:
                return None
            added.append(rule)
        return amounts, is_counted, counted, tuple(extra), added


def is_counted(
    prices: Mapping[str, PriceHistory], charges: Sequence[tuple[str, str, int]], at_us: int
) -> bool:
    """Whether a charge's price at ``at_us`` depends on its window's total."""
    for _, limit, _ in charges:
        history = prices.get(limit)
        if history:
            price = price_at(history, at_us)
            if price is not None and price.counted:
                return True
    return False


def repriced(
    prices: Mapping[str, PriceHistory],
    spend: Mapping[str, Sequence[str]],
    charges: Sequence[tuple[str, str, int]],
    at_us: int,
    used: Sequence[int],
) -> tuple[list[PricedCharge], list[int | None]]:
    """An expanded event's priced charges (its own, then its spend charges)
    priced with ``used`` (what each charge's counter held before the event),
    and per charge the spend charges' amounts, None for its own."""
    priced = priced_charges(charges, prices, at_us, used)
    tail = [amount for _, _, amount in spend_charges(priced, spend)]
    return priced, [None] * (len(charges) - len(tail)) + tail


def refuse_spend_charge(limit: Limit) -> InvalidInput | None:
    """A spend limit is charged by prices only: a charge naming it is refused."""
    if limit.currency is None:
        return None
    return InvalidInput(
        "limit",
        f"{limit.name!r} is a spend limit ({limit.currency}): it is charged through "
        "the prices of other limits, not directly",
    )
