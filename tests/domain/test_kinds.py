"""What each kind of limit refuses, and the words that name it (`metering.domain.kinds`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from metering.domain.kinds import KINDS, Use, kind_phrases, prices_taken, refuse, sums_usage
from metering.domain.limits import Limit, spend_limit
from metering.domain.money import Price
from metering.errors import InvalidInput, WrongAlgorithm

PLAIN = Limit("calls", 100, "1mo", window="calendar")
SPEND = spend_limit("spend", "50.00", "USD", "1mo")
SEATS = Limit("seats", 5, "1mo", window="calendar", distinct="user")
LICENSES = Limit("cad", 3, algorithm="concurrent")
GAUGE = Limit("storage", 100, "1mo", window="calendar", aggregation="max")
BUCKET = Limit("api", 10, "10s", algorithm="token_bucket")
PACED = Limit("budget", 3000, "1mo", window="calendar", pacing=True, burst="10%")
SHADOW = Limit("trial", 5, "1mo", window="calendar", enforcement="shadow")

# Each kind's example, by its label in `KINDS`.
EXAMPLES = {
    "a spend limit": SPEND,
    "a seat limit": SEATS,
    "a concurrent limit": LICENSES,
    "a gauge": GAUGE,
    "a token bucket": BUCKET,
    "a shadow limit": SHADOW,
}
USES: tuple[Use, ...] = ("price", "tiered price", "grant", "hold")


def test_every_kind_has_an_example_of_its_own() -> None:
    assert [kind.label for kind in KINDS] == list(EXAMPLES)
    for kind in KINDS:
        assert [other.label for other in KINDS if other.of(EXAMPLES[kind.label])] == [kind.label]


@pytest.mark.parametrize("use", USES)
def test_a_plain_limit_takes_every_use_but_a_checkout(use: Use) -> None:
    refuse(PLAIN, use)
    refuse(PACED, use)  # pacing is a rule of its own, not a kind that refuses anything
    with pytest.raises(WrongAlgorithm, match="only a concurrent limit is checked out"):
        refuse(PLAIN, "checkout")


@pytest.mark.parametrize("label", list(EXAMPLES))
def test_each_kind_refuses_what_it_declares_and_takes_the_rest(label: str) -> None:
    [kind] = [kind for kind in KINDS if kind.label == label]
    limit = EXAMPLES[label]
    for use in USES:
        if use not in kind.refused:
            if use != "tiered price" or limit.algorithm == "fixed_window":
                refuse(limit, use)
            continue
        field, why = kind.refused[use]
        expected = WrongAlgorithm if use in kind.by_algorithm else InvalidInput
        with pytest.raises(expected) as raised:
            refuse(limit, use)
        assert type(raised.value) is expected
        assert raised.value.field == field
        assert raised.value.message.endswith(why)
        assert raised.value.message.startswith(f"{limit.name!r} is ")


def test_the_errors_say_which_limit_and_why() -> None:
    with pytest.raises(InvalidInput, match=r"'spend' is a spend limit: it has a cap"):
        refuse(SPEND, "price")
    with pytest.raises(InvalidInput, match=r"'seats' is a seat limit: .* do not reserve it"):
        refuse(SEATS, "hold")
    with pytest.raises(WrongAlgorithm, match=r"'cad' is concurrent: grants top up fixed windows"):
        refuse(LICENSES, "grant")
    with pytest.raises(InvalidInput, match=r"'storage' is a gauge: .* no cost to hold"):
        refuse(GAUGE, "hold")
    with pytest.raises(InvalidInput) as raised:
        refuse(BUCKET, "tiered price")
    assert raised.value.field == "model"
    refuse(BUCKET, "price")  # a flat price per unit prices a bucket's charges
    with pytest.raises(
        InvalidInput, match=r"'trial' is a shadow limit: it bills nothing"
    ) as raised:
        refuse(SHADOW, "price")
    assert raised.value.field == "limit"
    refuse(LICENSES, "checkout")


def test_kind_phrases_name_what_sets_a_limit_apart() -> None:
    assert kind_phrases(PLAIN) == []
    assert kind_phrases(SEATS) == ["distinct user"]
    assert kind_phrases(GAUGE) == ["gauge max"]
    assert kind_phrases(PACED) == ["paced burst 10%"]


def test_only_a_gauge_and_a_floating_license_do_not_sum_their_usage() -> None:
    assert [limit.name for limit in [PLAIN, *EXAMPLES.values()] if not sums_usage(limit)] == [
        "cad",
        "storage",
    ]


def test_a_kind_takes_only_the_prices_it_takes() -> None:
    """A price set before a limit was made a kind that refuses it prices none
    of its charges (a late event's, in force at its time, included)."""
    per_unit = Price("calls", "USD", 1_000_000, 10)
    fee = Price("calls", "USD", 1_000_000, 20, flat_fee=700)
    removed = Price("calls", "USD", None, 30)
    history = (per_unit, fee, removed)
    plain = Limit("calls", maximum=5, period="1h")
    assert prices_taken(plain, history) == history
    assert prices_taken(None, history) == history  # deleted: as it was
    gauge = Limit("calls", maximum=5, period="1h", aggregation="max")
    assert prices_taken(gauge, history) == ()
    shadow = Limit("calls", maximum=5, period="1h", enforcement="shadow")
    assert prices_taken(shadow, history) == ()  # its would-denies consumed nothing to price
    bucket = Limit("calls", maximum=5, period="1h", algorithm="token_bucket")
    assert prices_taken(bucket, history) == (
        per_unit,
        replace(fee, flat_fee=0, per_unit=None),
        removed,
    )


def test_a_refused_tiered_price_keeps_its_dates() -> None:
    fee = Price("calls", "USD", 1_000_000, 20, created_at_us=15, flat_fee=700)
    bucket = Limit("calls", maximum=5, period="1h", algorithm="token_bucket")
    assert prices_taken(bucket, (fee,)) == (Price("calls", "USD", None, 20, 15),)


def test_a_checkout_of_a_windowed_limit_names_the_limit_and_its_algorithm() -> None:
    with pytest.raises(WrongAlgorithm) as refused:
        refuse(Limit("calls", maximum=5, period="1h"), "checkout")
    assert (refused.value.limit, refused.value.algorithm) == ("calls", "fixed_window")
    assert str(refused.value) == (
        "limit: 'calls' is fixed_window: only a concurrent limit is checked out; consume this one"
    )
