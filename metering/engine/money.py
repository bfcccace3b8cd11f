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
cached with the limits (`PriceBook`, `metering.engine.fast.LimitCache`).

A tiered price or a flat fee (`Price.counted`) charges by what its window
held before the event: the event carries its spend charges from the start
(0 kept), and each path prices them again at decision time with the
counters it decides with (`repriced`), so a batch's events each see the
totals the ones before them left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from metering.domain.events import Charge, UsageEvent
from metering.domain.limits import Limit
from metering.domain.money import (
    PricedCharge,
    PriceHistory,
    price_at,
    priced_charges,
    spend_charges,
)
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
        prices = found.histories(c.limit for e in events for c in e.charges)
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
    def read(cls, store: PriceStore, version: int) -> PriceBook:
        return cls(version, store.histories(), store.spend_limits())

    def charges(
        self, charges: Sequence[tuple[str, str, int]], at_us: int
    ) -> tuple[list[PricedCharge], list[Charge]]:
        """The priced charges among ``charges`` at ``at_us`` and the spend
        charges they add (`Money.expand`); `InvalidInput` for one that would
        cost too much (`Money.refusal`)."""
        priced = priced_charges(charges, self.prices, at_us)
        return priced, [Charge(*c) for c in spend_charges(priced, self.spend)]


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
