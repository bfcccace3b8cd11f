"""`metering limits set --pacing [--burst N|P%]`: stored, listed and described;
a charge ahead of the pace denied (hard) or shown ahead of its pace (soft);
a bad pace one line on stderr, exit 1, nothing stored. CliRunner on SQLite."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from metering import Limit, Meter
from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite database (a copy of the session's template)."""
    return sqlite_url


def run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database", url, *args])
    return result.exit_code, result.output


def test_a_paced_limit_is_set_listed_and_decided(url: str) -> None:
    code, out = run(url, "limits", "set", "budget", "--max", "3000", "--period", "1mo", "--pacing")
    assert code == 0 and "paced burst 5%" in out
    code, out = run(url, "limits", "set", "soft", "--max", "10", "--period", "1d")
    assert "paced" not in out
    run(url, "limits", "set", "soft", "--max", "10", "--period", "1d", "--enforcement", "soft")
    code, out = run(url, "limits", "list")
    assert "paced burst 5%" in out
    with Meter(url) as meter:
        assert meter.get_limit("budget") == Limit("budget", 3000, "1mo", pacing=True)
    assert run(url, "consume", "org-1", "budget", "--cost", "150")[0] == 0
    code, out = run(url, "consume", "org-1", "budget", "--cost", "1")
    assert code == 2 and "retry at" in out  # denied


def test_a_soft_limit_ahead_of_its_pace_says_so(url: str) -> None:
    options = ["--max", "100", "--period", "1d", "--enforcement", "soft", "--pacing"]
    run(url, "limits", "set", "tokens", *options, "--burst", "0")
    code, out = run(url, "consume", "org-1", "tokens", "--cost", "100")
    assert code == 0 and "ahead of its pace (not billed)" in out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--burst", "3"], "error: burst: only a paced limit has a burst: add pacing"),
        (["--pacing", "--burst", "200%"], "error: burst: '200%' is not units or a percentage"),
        (["--pacing", "--burst", "11"], "error: burst: must be between 0 and 10 units, got 11"),
    ],
)
def test_a_bad_pace_is_one_line_and_stores_nothing(
    url: str, options: list[str], message: str
) -> None:
    code, out = run(url, "limits", "set", "budget", "--max", "10", "--period", "1h", *options)
    assert code == 1
    assert out.startswith(message) and out.count("\n") == 1
    with Meter(url) as meter:
        assert meter.list_limits() == []
