"""The single event in one round trip on PostgreSQL.

`prepare` turns an event into the call of ``metering_consume_one``
(`metering.storage.hot.one_trip`), a PL/pgSQL copy of `metering.domain.rules`,
working out from the cached limits what needs no lock: each charge's window and billing
month, maximum, spend charges (a price by the window's total: its tiers), dimensions'
values, a pace's burst, a gauge's aggregation and a breaker's quarantine; what its charges'
subjects and limits give is planned per version of the cache (`LimitCache.plans`), the
costs applied per call. A need not in `ONE_TRIP_IMPLEMENTS`, or an unacceptable event, is
`Declined` for the fast path. `tests/engine/test_differential.py` holds it to the reference.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

from metering.domain.breaker import quarantine_cap
from metering.domain.events import Charge, EventRecord
from metering.domain.money import Price, price_at
from metering.domain.needs import Need
from metering.domain.pacing import burst_units
from metering.domain.rollups import dimension_value
from metering.domain.rules import Rule
from metering.domain.windows import calendar_window
from metering.domain.zones import ZoneHistory, billing_month
from metering.engine.answers import Declined
from metering.engine.limit_cache import (
    Allowances,
    CalendarWindows,
    LimitCache,
    rules_for,
    seat_value,
)
from metering.engine.money import FOREVER_US
from metering.errors import InvalidInput
from metering.storage.hot.one_trip import (
    Breaker,
    HeldAt,
    OneCharge,
    PlainParts,
    TieredPrice,
    call_parameters,
    lock_order,
    plain_parts,
    plain_text,
)
from metering.storage.results import ResultRecord

STATS: Final[Counter[str]] = Counter()
ONE_TRIP_IMPLEMENTS: Final = frozenset(
    {
        *(Need.ENTITLEMENTS, Need.OWN_THRESHOLDS, Need.SEATS, Need.GRANTS, Need.RECURRING),
        *(Need.MONEY, Need.TIME_ZONE, Need.DIMENSIONS, Need.PACING, Need.GAUGE, Need.BREAKER),
    }
)
# A charge's price: its (currency, amount) as priced before the counters are
# read, and its price by the window's total, or a spend charge's priced charges.
_Priced = tuple[tuple[str, int] | None, TieredPrice | tuple[int, ...] | None]
_UNPRICED: Final[_Priced] = (None, None)
# The zoned subjects' calendar windows, as the fast path remembers them, for
# the allowances they were worked out with (replaced with them).
_zoned: list[CalendarWindows] = [CalendarWindows({})]


# An event's plan (`_plan`): what its charges' subjects and limits give whatever
# their costs, seat values and metadata, while the cache's version lasts and its
# time is in [from, until) (the maxima of the subjects' histories and the prices
# in force then): per charge (`_Step`) its rule (the subject's maximum and own
# thresholds), subject, whether grants pay it, the subject's time zone and the
# rule's `_Shared`, and a plain charge's parts of text (`plain_parts`); the lock
# order, and whether grants pay a paced limit.
_Fixed = tuple[str, int, str, int, Sequence[int], Sequence[int], int | None, Breaker | None]
# A rule's fields of the call that no event changes, and its last window (but a
# zoned subject's calendar one): kept by the rule's id with the rule itself.
_Shared = tuple[Rule, _Fixed, list[tuple[int, int]]]
_Step = tuple[Rule, str, bool, ZoneHistory | None, _Shared, PlainParts | None]
_Plan = tuple[int, int, int, tuple[_Step, ...], list[int], bool]
PLANS_KEPT: Final = 10_000  # (all forgotten past it)
_shared: dict[int, _Shared] = {}
_SHARED_KEPT: Final = 4096
_NO_WINDOW: Final = (0, 0)


def prepare(cache: LimitCache, event: EventRecord, now_us: int) -> tuple[Any, ...] | Declined:
    """The parameters of the function's call for ``event``, or why not."""
    version, rules, allowances = cache.current
    if version < 0:
        return Declined("the limits are not loaded yet", stale=True)
    event_rules, error = rules_for(event, rules, now_us)
    if error is not None:
        return Declined(str(error), Need.INVALID)
    charges = event.charges
    amounts: dict[int, _Priced] = {}
    if any(rule.money for rule in event_rules):
        spent = _spend(cache, version, event)
        if isinstance(spent, Declined):
            return spent
        charges, amounts = spent
    at_us = event.occurred_at_us
    key = tuple([charge[:2] for charge in charges])
    plan: _Plan | None = cache.plans.get(key)
    if plan is None or plan[0] != version or not plan[1] <= at_us < plan[2]:
        found = _plan(cache, version, rules, allowances, event, charges, key)
        if isinstance(found, Declined):
            return found
        plan = found
    if allowances.due and allowances.due_pairs(((n, s) for s, n in key), now_us):
        return Declined("a recurring grant's issue is due", Need.RECURRING)
    if plan[5]:
        return Declined("grants on a paced limit", Need.PACING)
    zones = allowances.zones
    windows = _zoned[0]
    if zones and windows.zones is not zones:
        windows = _zoned[0] = CalendarWindows(zones)
    metadata = event.metadata
    found_charges: list[OneCharge | str] = []
    for index, (rule, subject, paid, zoned, (_, fixed, last), parts) in enumerate(plan[3]):
        cost = charges[index][2]
        kind = fixed[0]
        month = None
        if kind == "c":
            if zoned is None:
                window = last[0]  # (read once: another thread may replace it)
                if not window[0] <= at_us < window[1]:
                    window = last[0] = calendar_window(rule.period, at_us)
            else:  # the subject's window and its billing month, as the fast path's
                window = windows.calendar(rule, subject, at_us)
                month = billing_month(zoned, window[0])
        else:
            window = last[0]
            if zoned is not None and kind == "f":  # opening at the event: it bills in its month
                month = billing_month(zoned, at_us)
        price, tiers = amounts.get(index, _UNPRICED)
        if parts is not None and price is None and tiers is None:
            found_charges.append(plain_text(parts, cost, *window))
            continue
        # (`rules_for` found the seat's value acceptable, and remembers it.)
        seat = seat_value(rule, event, cost) if rule.distinct else None
        found_charges.append(
            (
                rule.name,
                subject,
                cost,
                kind,
                fixed[1],
                fixed[2],
                fixed[3],
                *window,
                fixed[4],
                fixed[5],
                seat,
                paid,
                price,
                month,
                # The values its consumed cost is rolled up by.
                tuple((k, dimension_value(metadata, k)) for k in rule.dimensions)
                if rule.dimensions
                else (),
                fixed[6],
                rule.gauge,
                tiers,
                fixed[7],
                # The stamp the seat is known held at: the function skips its row at that stamp.
                None
                if seat is None or kind != "c"
                else cache.held.held_at((rule.name, subject, window[0]), seat),
            )
        )
    return call_parameters(
        version, event.event_id, event.fingerprint, at_us, now_us, metadata, found_charges, plan[4]
    )


def _plan(
    cache: LimitCache,
    version: int,
    rules: dict[str, Rule],
    allowances: Allowances,
    event: EventRecord,
    charges: tuple[Charge, ...],
    key: tuple[tuple[str, str], ...],
) -> _Plan | Declined:
    """The plan of ``event`` with its spend charges (``charges``), kept by
    their subjects and limits (``key``)."""
    charged = event if charges is event.charges else event._replace(charges=charges)
    needs = allowances.charged(rules, [charged]) - ONE_TRIP_IMPLEMENTS
    if needs:
        return Declined("not for the function", min(needs))
    at_us = event.occurred_at_us
    from_us, until_us = -FOREVER_US, FOREVER_US
    prices = cache.pricing.book.prices
    histories, alerts, granted = allowances.histories, allowances.alerts, allowances.grant_pairs
    zones = allowances.zones
    steps: list[_Step] = []
    paced = False
    for subject, name, _ in charges:
        rule = rules[name]
        if histories or alerts:
            history, own = histories.get((name, subject)), alerts.get((name, subject))
            if history or own:
                rule = cache.rule_for(rule, history, at_us, own)
                if history:
                    starts = [change[0] for change in history]
                    from_us, until_us = _between(starts, at_us, from_us, until_us)
        if name in prices:  # (priced per call; the plan still holds from its price on)
            starts = [price.effective_from_us for price in prices[name]]
            from_us, until_us = _between(starts, at_us, from_us, until_us)
        paid = (name, subject) in granted
        paced = paced or (paid and rule.pacing is not None)
        zoned = zones.get(subject) if zones else None
        shared = _shared.get(id(rule))
        if shared is None or shared[0] is not rule:
            if len(_shared) >= _SHARED_KEPT:
                _shared.clear()
            shared = _shared[id(rule)] = (rule, _fixed(rule), [_window(rule)])
        fixed = shared[1]
        plain = not (paid or rule.distinct or rule.dimensions or rule.gauge) and zoned is None
        parts = (
            plain_parts(name, subject, fixed[0], *fixed[1:6])
            if plain and fixed[6] is None and fixed[7] is None
            else None
        )
        steps.append((rule, subject, paid, zoned, shared, parts))
    order = lock_order([(name, subject) for subject, name in key])
    plan = (version, from_us, until_us, tuple(steps), order, paced)
    plans = cache.plans
    if len(plans) >= PLANS_KEPT:
        plans.clear()
    plans[key] = plan
    return plan


def _between(starts: list[int], at_us: int, from_us: int, until_us: int) -> tuple[int, int]:
    """[``from_us``, ``until_us``) narrowed to the times between the changes
    starting at ``starts`` (in time order) around ``at_us``."""
    index = bisect_right(starts, at_us)
    if index:
        from_us = max(from_us, starts[index - 1])
    if index < len(starts):
        until_us = min(until_us, starts[index])
    return from_us, until_us


def _fixed(rule: Rule) -> _Fixed:
    """The function's fields of a charge on ``rule`` that no event changes."""
    limit = rule.limit
    return (
        "b" if rule.bucket else ("c" if rule.calendar else "f"),
        rule.maximum,
        "soft" if rule.soft else ("shadow" if rule.shadow else "hard"),
        rule.token_us,
        limit.thresholds,
        limit.thresholds_units,
        None if rule.pacing is None else burst_units(rule.pacing, rule.maximum),
        None if limit.breaker_factor is None else _breaker(rule),
    )


def _window(rule: Rule) -> tuple[int, int]:
    """A charge's window but a calendar one's (worked out per event): a
    bucket's none, a first-use window its period (a first-use window of
    calendar months is declined: `Need.MONTH_FIRST_USE`)."""
    if rule.bucket or rule.calendar:
        return _NO_WINDOW
    return (0, rule.period.seconds * 1_000_000)


def _spend(
    cache: LimitCache, version: int, event: EventRecord
) -> tuple[tuple[Charge, ...], dict[int, _Priced]] | Declined:
    """``event``'s charges with its spend charges after its own (`Money.expand`),
    and each priced charge's (currency, amount) by position; with a price by the
    window's total (tiers, a flat fee), each priced charge's price too, and each
    spend charge the positions of the priced charges it sums, by position."""
    pricing = cache.pricing
    book = pricing.book
    if book.version != version:
        return Declined("prices cached at another version", stale=True)
    at_us = event.occurred_at_us
    try:
        expanded = pricing.expand(event.charges, at_us)
    except InvalidInput as exc:
        return Declined(str(exc), Need.INVALID)
    if expanded is None:
        return Declined("a spend limit not cached", stale=True)
    amounts, counted, _, charges, _ = expanded
    if not counted:
        return charges, {index: (amount, None) for index, amount in amounts.items()}
    # Priced by the function from the counters it locks (`money.tiered_amount`).
    found: dict[int, _Priced] = {}
    for index, amount in amounts.items():
        price = price_at(book.prices[event.charges[index][1]], at_us)
        assert price is not None
        found[index] = (amount, _price_of(price))
    currencies = {name: currency for currency, names in book.spend.items() for name in names}
    head = len(event.charges)
    for position, (subject, name, _) in enumerate(charges[head:], head):
        currency = currencies[name]
        summed = tuple(
            index + 1
            for index, (priced_in, _) in amounts.items()
            if event.charges[index][0] == subject and priced_in == currency
        )
        found[position] = (None, summed)
    return charges, found


def _breaker(rule: Rule) -> Breaker:
    """``rule``'s breaker as the function steps it, with the quarantine a
    quarantined subject is held to (`Limit.quarantined`, from the maximum in force)."""
    limit = rule.limit
    assert limit.breaker_factor is not None
    cap = quarantine_cap(rule.maximum, limit.breaker_factor, limit.quarantine_max)
    return (limit.breaker_factor, limit.breaker_floor, cap, "shadow" if rule.shadow else "hard")


@lru_cache(maxsize=256)
def _price_of(price: Price) -> TieredPrice:
    """``price`` as the function prices a window's total (its element 20)."""
    return (
        price.currency,
        price.model,
        price.flat_fee,
        tuple((up_to, each) for up_to, each in price.tiers),
        price.package,
        price.per_package,
        price.per_unit,
    )


def learn_held(
    cache: LimitCache, event: EventRecord, result: ResultRecord, held: Sequence[HeldAt]
) -> None:
    """Teach the cache's `HeldCache` the seats the function found held, each
    with its window (as the result's row spells it) and the stamp it was held at."""
    rules = cache.current[1]
    for position, stamp in held:
        subject, name, cost = event.charges[position]
        rule = rules.get(name)
        if rule is None or not rule.distinct:
            continue
        value = seat_value(rule, event, cost)
        cache.held.learn((name, subject, int(result.charges[position][9])), stamp, value)
