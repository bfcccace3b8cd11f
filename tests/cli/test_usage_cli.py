"""``metering usage SUBJECT``: the subject's limits now with ``runs out at``
(docs/forecasts.md), as a table and as JSON. CliRunner on SQLite; the CLI
reads the system clock, so the forecast is checked against the instants
around the command."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


def run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database", url, *args])
    return result.exit_code, result.output


def test_usage_shows_when_the_allowance_runs_out(url: str) -> None:
    run(url, "limits", "set", "calls", "--max", "1000", "--period", "7d")
    run(url, "limits", "set", "spent", "--max", "5", "--period", "7d")
    before = datetime.now(UTC)
    assert run(url, "consume", "org-1", "calls", "--cost", "360")[0] == 0
    assert run(url, "consume", "org-1", "spent", "--cost", "5")[0] == 0
    code, out = run(url, "usage", "org-1", "--format", "json")
    after = datetime.now(UTC)
    assert code == 0, out
    found = {u["limit"]: u for u in json.loads(out)}
    # 360 units at once: 0.1 a second, decaying; the 640 left last 6,400 s at it.
    exhausts_at = datetime.fromisoformat(found["calls"]["exhausts_at"])
    faded = math.exp((after - before).total_seconds() / 3_600)  # decayed since the charge
    latest = after + timedelta(seconds=6_400 * faded + 1)
    assert before + timedelta(seconds=6_400) <= exhausts_at <= latest
    assert before <= datetime.fromisoformat(found["spent"]["exhausts_at"]) <= after  # spent
    code, out = run(url, "usage", "org-1")
    assert code == 0 and "runs out at" in out and "calls" in out


def test_a_subject_without_usage(url: str) -> None:
    run(url, "limits", "set", "calls", "--max", "1000", "--period", "7d")
    assert run(url, "usage", "nobody") == (0, "no usage\n")


def test_limits_set_takes_a_forecast_lead(url: str) -> None:
    code, out = run(
        url, "limits", "set", "calls", "--max", "1000", "--period", "1d", "--forecast-lead", "24h"
    )
    assert code == 0 and "forecast lead 1d" in out
    code, out = run(
        url, "limits", "set", "calls", "--max", "9", "--period", "1d", "--forecast-lead", "1mo"
    )
    assert code == 1 and "forecast_lead" in out
