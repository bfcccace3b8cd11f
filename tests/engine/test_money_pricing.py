"""`Pricing`: what an event's charges give, remembered per version of the
cached prices, is what pricing them afresh gives; an event before the last
price change is priced by the price in force at its time; a new price is
charged from the next event on, whatever was remembered before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from metering import FrozenClock, Limit, Meter, make_event, spend_limit
from metering.domain.events import Charge
from metering.domain.money import Price
from metering.domain.rules import Rule
from metering.engine.money import PriceBook, Pricing

HOUR_US = 3_600_000_000
CALLS = Limit("calls", maximum=10**9, period="1mo", window="calendar")
SPEND = spend_limit("spend", "1000", "USD", "1mo", window="calendar")
RULES = {"calls": Rule.of(CALLS, priced=True), "spend": Rule.of(SPEND)}


def book(*prices: Price) -> PriceBook:
    return PriceBook(1, {"calls": prices}, {"USD": ("spend",)})


def test_an_event_is_priced_as_afresh_and_its_like_remembered() -> None:
    pricing = Pricing(book(Price("calls", "USD", 1_000_000, 0)), RULES)
    charges = (Charge("org-a", "calls", 3),)
    found = pricing.expand(charges, HOUR_US)
    assert found is not None
    amounts, counted, _, expanded, added = found
    assert amounts == {0: ("USD", 3)} and not counted
    assert expanded == (*charges, Charge("org-a", "spend", 3))
    assert added == [RULES["spend"]]
    assert pricing.expand((Charge("org-a", "calls", 3),), 2 * HOUR_US) is found
    other = pricing.expand((Charge("org-b", "calls", 3),), HOUR_US)
    assert other is not None and other[3][1] == Charge("org-b", "spend", 3)


def test_an_event_before_the_last_change_takes_the_price_then() -> None:
    pricing = Pricing(
        book(Price("calls", "USD", 1_000_000, 0), Price("calls", "USD", 2_000_000, 5 * HOUR_US)),
        RULES,
    )
    charges = (Charge("org-a", "calls", 1),)
    for at_us, amount in [(HOUR_US, 1), (6 * HOUR_US, 2), (4 * HOUR_US, 1), (5 * HOUR_US, 2)]:
        found = pricing.expand(charges, at_us)
        assert found is not None and found[0] == {0: ("USD", amount)}
    assert list(pricing.events) == [charges]  # only the settled times' are kept by charges


def test_what_is_remembered_is_forgotten_past_its_size() -> None:
    pricing = Pricing(book(Price("calls", "USD", 1_000_000, 0)), RULES, size=3)
    for n in range(7):
        assert pricing.expand((Charge(f"org-{n}", "calls", 1),), HOUR_US) is not None
        assert max(len(pricing.events), len(pricing.priced), len(pricing.extras)) <= 3


def test_a_spend_limit_not_cached_is_none() -> None:
    pricing = Pricing(book(Price("calls", "USD", 1_000_000, 0)), {"calls": RULES["calls"]})
    assert pricing.expand((Charge("org-a", "calls", 1),), HOUR_US) is None


def test_a_new_price_is_charged_from_the_next_event_on(db_url: str) -> None:
    now = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    clock = FrozenClock(now)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits([CALLS, SPEND])
        meter.set_price("calls", "0.01", "USD")
        spent = []
        for n, price in enumerate(["0.02", "0.05"]):
            meter.consume("org-a", "calls", 1)
            meter.apply([make_event([("org-a", "calls", 2)], clock(), f"e-{n}")], invalid="raise")
            [usage] = [u for u in meter.usage("org-a") if u.limit.name == "spend"]
            spent.append(usage.used)
            clock.advance(timedelta(minutes=1))
            meter.set_price("calls", price, "USD")
        assert spent == [3, 3 + 6]


def test_a_late_event_on_a_limit_made_a_gauge_or_a_bucket_is_not_priced_as_before(
    db_url: str,
) -> None:
    """The price in force at a late event's time was set before its limit was
    made a kind that refuses it: the event is decided as that kind, unpriced
    (a gauge's level is not billed; a bucket has no window for a fee)."""
    clock = FrozenClock(datetime(2026, 12, 1, 10, 0, tzinfo=UTC))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(SPEND)
        for name in ("disk", "api"):
            meter.set_limit(Limit(name, maximum=50, period="1h", window="calendar"))
            meter.set_price(name, "0.01", "USD", flat_fee="7")
        clock.advance(minutes=10)
        meter.remove_price("disk", "USD")
        meter.remove_price("api", "USD")
        meter.set_limit(
            Limit("disk", maximum=50, period="1h", window="calendar", aggregation="max")
        )
        meter.set_limit(Limit("api", maximum=50, period="1h", algorithm="token_bucket"))
        late = clock() - timedelta(minutes=5)
        for name in ("disk", "api"):
            decision = meter.consume("org-1", name, 3, occurred_at=late)
            assert [(c.limit, c.price) for c in decision.charges] == [(name, None)]
