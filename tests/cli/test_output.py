"""What the command line prints (`cli/output.py`): a limit on one line with
every feature it has, and a spend limit's figures as money."""

from __future__ import annotations

from metering.cli.output import describe_limit, money, spend_currencies
from metering.domain.limits import Limit, spend_limit


def test_a_limit_is_one_line_of_its_features() -> None:
    plain = Limit("calls", maximum=100, period="1h")
    assert describe_limit(plain) == (
        "calls: max 100 per 1h, fixed_window, first_use window, hard, lateness 1d"
    )
    full = Limit(
        "seats",
        maximum=5,
        period="1mo",
        window="calendar",
        enforcement="soft",
        distinct="user",
        thresholds=(50, 80),
        thresholds_units=(4,),
        lateness="10m",
    )
    assert describe_limit(full) == (
        "seats: max 5 per 1mo, fixed_window, calendar window, distinct user, soft,"
        " thresholds 50%/80%, threshold units 4, lateness 10m"
    )
    bucket = Limit("api", maximum=10, period="1s", algorithm="token_bucket")
    assert describe_limit(bucket).startswith("api: max 10 per 1s, token_bucket, hard, lateness")
    gauge = Limit("disk", maximum=9, period="1d", aggregation="max")
    assert ", gauge max, " in describe_limit(gauge)
    paced = Limit("paced", maximum=100, period="1d", pacing=True, burst="5%")
    assert ", paced burst 5%, " in describe_limit(paced)
    floating = Limit("cad", maximum=3, algorithm="concurrent")
    assert describe_limit(floating) == "cad: max 3 held at once, concurrent, hard"


def test_a_spend_limits_figures_are_money() -> None:
    spend = spend_limit("spend", "50", "USD", "1mo")
    assert describe_limit(spend).startswith("spend: max 50.00 USD per 1mo, ")
    currencies = spend_currencies([spend, Limit("calls", maximum=5, period="1h")])
    assert currencies == {"spend": "USD"}
    assert money(4, "spend", currencies) == "0.04 USD"
    assert money(4, "calls", currencies) == "4"
