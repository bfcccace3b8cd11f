"""``metering prices set --model ... --tier ... --flat-fee`` (`metering/cli/prices.py`):
tiered prices on the command line (SQLite file, CliRunner); bad input is one
``error:`` line, exit 1, and nothing stored (flat prices: test_money_cli.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from metering import Meter
from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    found = sqlite_url
    run(found, "limits", "set", "calls", "--max", "100000", "--period", "1mo")
    return found


def run(url: str, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", url, *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_each_model_on_the_command_line(url: str) -> None:
    graduated = run(
        url,
        *["prices", "set", "calls", "--currency", "USD", "--model", "graduated"],
        *["--tier", "1000:0.01", "--tier", "inf:0.005", "--from", "2026-01-01"],
    )
    assert graduated.output.startswith(
        "calls: graduated USD: up to 1000 at 0.01, then 0.005 a unit from 2026-01-01"
    )
    volume = run(
        url,
        *["prices", "set", "calls", "--currency", "USD", "--model", "volume"],
        *["--tier", "1000:0.01", "--tier", "inf:0.005", "--flat-fee", "20", "--from", "2026-02-01"],
    )
    assert "volume USD: up to 1000 at 0.01, then 0.005 a unit, 20.00 USD a window" in volume.output
    package = run(
        url,
        *["prices", "set", "calls", "--currency", "USD", "--model", "package"],
        *["--package", "100", "--per-package", "1.00", "--from", "2026-03-01"],
    )
    assert "calls: 1.00 USD a package of 100 units from 2026-03-01" in package.output
    listed = json.loads(run(url, "prices", "list", "--format", "json").output)
    assert [p["model"] for p in listed] == ["graduated", "volume", "package"]
    assert listed[1]["tiers"] == [
        {"up_to": 1000, "price": "0.01"},
        {"up_to": None, "price": "0.005"},
    ]
    assert (listed[1]["flat_fee"], listed[2]["package"], listed[2]["per_package"]) == (
        "20.00",
        100,
        "1.00",
    )
    table = run(url, "prices", "list").output
    assert "1.00 USD a package of 100 units" in table


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "graduated", "--tier", "1000:0.01", "--tier", "500:0.02"], ["tiers"]),
        (["--model", "volume", "--tier", "1000:0.01", "--tier", "2000:0.005"], ["inf"]),
        (["--model", "graduated", "--tier", "1000:-0.01", "--tier", "inf:1"], ["tiers"]),
        (["--model", "package", "--package", "0", "--per-package", "1"], ["package"]),
        (["--model", "package", "--package", "10"], ["per_package"]),
        (["--per-unit", "0.01", "--tier", "inf:0.01"], ["tiers", "per_unit"]),
        ([], ["per_unit", "required"]),
    ],
)
def test_bad_tiers_are_one_error_line_and_change_nothing(
    url: str, args: list[str], words: list[str]
) -> None:
    result = run(url, "prices", "set", "calls", "--currency", "USD", *args, code=1)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert any(word in lines[0] for word in words), lines[0]
    with Meter(url) as meter:
        assert meter.prices() == []
