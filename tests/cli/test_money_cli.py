"""``metering prices``, spend limits and ``metering report spend`` through
click's CliRunner on a SQLite file.

Every bad input is one ``error:`` line on stderr, exit 1, and the database
is as it was (`snapshot`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", url, *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def snapshot(url: str) -> tuple[Any, ...]:
    with Meter(url) as meter:
        return meter.list_limits(), meter.prices(), meter.counters(), meter.entitlements()


def one_line_error(result: Result, *words: str) -> None:
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_prices_and_a_spend_cap_on_the_command_line(url: str) -> None:
    run(url, "limits", "set", "calls", "--max", "1000", "--period", "1mo", "--window", "calendar")
    made = run(
        url,
        "limits",
        "set",
        "spend",
        "--max-amount",
        "0.05",
        "--currency",
        "USD",
        "--period",
        "1mo",
        "--window",
        "calendar",
    )
    assert made.output.startswith("spend: max 0.05 USD per 1mo")
    priced = run(url, "prices", "set", "calls", "--per-unit", "0.002", "--currency", "USD")
    assert priced.output.startswith("calls: 0.002 USD a unit from ")
    listed = json.loads(run(url, "prices", "list", "--format", "json").output)
    assert [(p["limit"], p["per_unit"], p["currency"]) for p in listed] == [
        ("calls", "0.002", "USD")
    ]
    run(url, "consume", "org-1", "calls", "--cost", "20")
    denied = run(url, "consume", "org-1", "calls", "--cost", "10", code=2)
    assert "denied by spend" in denied.output
    run(url, "entitlements", "set", "org-1", "spend", "--max-amount", "1")
    run(url, "consume", "org-1", "calls", "--cost", "10")
    with Meter(url) as meter:
        month = meter.clock().strftime("%Y-%m")
    report = json.loads(run(url, "report", "spend", "--period", month, "--format", "json").output)
    assert report["rows"] == [
        {
            "subject": "org-1",
            "currency": "USD",
            "amounts": {"calls": "0.06"},
            "total": "0.06",
            "spend_limit": "spend",
            "cap": "1.00",
            "time_zone": None,
            "local_window": None,
        }
    ]
    lines = run(url, "report", "spend", "--period", month, "--format", "csv").output.splitlines()
    assert lines == [
        "subject,currency,total,spend_limit,cap,time_zone,local_window,amount:calls",
        "org-1,USD,0.06,spend,1.00,,,0.06",
    ]
    assert "org-1" in run(url, "report", "spend", "--period", month).output
    every = run(url, "report", "spend", "--format", "csv").output.splitlines()
    assert every == lines  # without --period: all time, as report overage
    assert "Spend, all time" in run(url, "report", "spend").output
    ended = run(url, "prices", "remove", "calls", "--currency", "USD")
    assert ended.output.startswith("calls: no price from ")


def test_a_spend_limit_s_figures_print_in_its_currency(url: str) -> None:
    run(url, "limits", "set", "calls", "--max", "1000", "--period", "1mo", "--window", "calendar")
    spend = ["--max-amount", "0.05", "--currency", "USD", "--period", "1mo", "--window", "calendar"]
    run(url, "limits", "set", "spend", *spend)
    run(url, "prices", "set", "calls", "--per-unit", "0.002", "--currency", "USD")
    allowed = run(url, "consume", "org-1", "calls", "--cost", "20").output.splitlines()
    assert allowed[0].startswith("allowed  org-1 calls  used 20/1000, 980 left")
    assert allowed[1].startswith("allowed  org-1 spend  used 0.04/0.05 USD, 0.01 USD left")
    denied = run(url, "consume", "org-1", "calls", "--cost", "10", code=2).output
    assert "denied  org-1 spend  used 0.04/0.05 USD, retry at" in denied
    counters = run(url, "counters", "--limit", "spend").output
    assert "0.04 USD" in counters and "0.02 USD" in counters  # used, denied cost
    report = run(url, "report", "overage").output
    assert "0.05 USD" in report and "0.04 USD" in report
    [counter] = json.loads(run(url, "counters", "--limit", "spend", "--format", "json").output)
    assert (counter["used"], counter["denied_cost"]) == (4, 2)  # JSON: minor units


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["prices", "set", "calls", "--per-unit", "0.002", "--currency", "XXX"], ["currency"]),
        (
            ["prices", "set", "calls", "--per-unit", "0.000000001", "--currency", "USD"],
            ["per_unit", "more than 8 decimals"],
        ),
        (["prices", "set", "calls", "--per-unit", "1.5e3", "--currency", "USD"], ["per_unit"]),
        (["prices", "set", "spend", "--per-unit", "1", "--currency", "USD"], ["spend limit"]),
        (["prices", "set", "nope", "--per-unit", "1", "--currency", "USD"], ["unknown limit"]),
        (["limits", "set", "cap", "--max-amount", "50", "--period", "1mo"], ["--currency"]),
        (["limits", "set", "cap", "--currency", "USD", "--period", "1mo"], ["--max-amount"]),
        (
            [
                "limits",
                "set",
                "cap",
                "--max-amount",
                "5.001",
                "--currency",
                "USD",
                "--period",
                "1d",
            ],
            ["max_amount", "more than 2 decimals"],
        ),
        (
            [
                "limits",
                "set",
                "cap",
                "--max-amount",
                "5",
                "--currency",
                "EUR",
                "--max",
                "5",
                "--period",
                "1d",
            ],
            ["--max-amount"],
        ),
        (
            ["limits", "set", "cap", "--max-amount", "5", "--currency", "ZZZ", "--period", "1d"],
            ["unknown currency"],
        ),
        (["limits", "set", "cap", "--period", "1d"], ["--max"]),
        (["entitlements", "set", "org-1", "calls", "--max-amount", "5"], ["not a spend limit"]),
        (["entitlements", "set", "org-1", "spend", "--max-amount", "5.123"], ["max_amount"]),
        (["entitlements", "set", "org-1", "spend"], ["MAXIMUM"]),
        (["consume", "org-1", "spend", "--cost", "5"], ["spend limit", "not directly"]),
        (["report", "spend", "--period", "2026-13"], ["period"]),
        (["prices", "set", "seats", "--per-unit", "1", "--currency", "USD"], ["seat limit"]),
        (["prices", "set", "cad", "--per-unit", "1", "--currency", "USD"], ["concurrent limit"]),
    ],
)
def test_bad_money_input_is_one_error_line_and_changes_nothing(
    url: str, args: list[str], words: list[str]
) -> None:
    run(url, "limits", "set", "calls", "--max", "1000", "--period", "1mo")
    run(url, "limits", "set", "spend", "--max-amount", "1", "--currency", "USD", "--period", "1mo")
    run(url, "prices", "set", "calls", "--per-unit", "0.01", "--currency", "USD")
    run(url, "limits", "set", "seats", "--max", "5", "--period", "1mo", "--distinct", "user")
    run(url, "limits", "set", "cad", "--max", "5", "--algorithm", "concurrent")
    before = snapshot(url)
    one_line_error(run(url, *args, code=1), *words)
    assert snapshot(url) == before


def test_a_charge_costing_more_than_the_largest_amount_is_one_error_line(url: str) -> None:
    run(url, "limits", "set", "big", "--max", "1000000000000", "--period", "1d")
    run(url, "prices", "set", "big", "--per-unit", "10000000", "--currency", "USD")
    before = snapshot(url)
    refused = run(url, "consume", "org-x", "big", "--cost", "1000000000000", code=1)
    one_line_error(refused, "the most one charge may cost", "'big'")
    assert snapshot(url) == before
