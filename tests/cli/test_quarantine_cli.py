"""`metering limits set ... --breaker 10x [--breaker-floor R] [--quarantine-max N]`
and `metering quarantine list|release`: a breaker set and described; a bad
factor or floor one line on stderr, exit 1, nothing stored; a quarantine
listed (text and JSON) and released, a second release an error. CliRunner
on SQLite, the burst by a `Meter` on a frozen clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from metering import FrozenClock, Meter
from metering.cli import main


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A migrated SQLite file (a copy of the session's template)."""
    return sqlite_url


def run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database", url, *args])
    return result.exit_code, result.output


def test_a_breaker_is_set_and_described(url: str) -> None:
    code, out = run(
        url,
        *("limits", "set", "api", "--max", "100000", "--period", "1d"),
        *("--breaker", "10x", "--breaker-floor", "0.1", "--quarantine-max", "1000"),
    )
    assert code == 0, out
    assert "breaker 10x floor 0.1/s quarantine max 1000" in out


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--breaker", "0x", "breaker"),
        ("--breaker", "abc", "breaker"),
        ("--breaker-floor", "-1", "breaker_floor"),
        ("--quarantine-max", "0", "quarantine_max"),
    ],
)
def test_a_bad_breaker_is_one_line_and_stores_nothing(
    url: str, option: str, value: str, field: str
) -> None:
    args = ["limits", "set", "api", "--max", "100", "--period", "1d", "--breaker", "10x"]
    code, out = run(url, *args, option, value)
    assert code == 1 and out.startswith(f"error: {field}: "), out
    assert out.count("\n") == 1
    assert "api" not in run(url, "limits", "list")[1]


def test_a_quarantine_is_listed_and_released(url: str) -> None:
    run(
        url,
        *("limits", "set", "api", "--max", "100000", "--period", "1d"),
        *("--breaker", "10x", "--breaker-floor", "0.1", "--quarantine-max", "1000"),
    )
    assert run(url, "quarantine", "list") == (0, "no subject is quarantined\n")
    clock = FrozenClock(datetime(2026, 11, 2, tzinfo=UTC))
    with Meter(url, clock=clock) as meter:
        for _ in range(62):  # a minute past 10 x the floor: tripped
            meter.consume("org-1", "api", 60)
            clock.advance(seconds=1)
    code, out = run(url, "quarantine", "list")
    assert code == 0 and "org-1" in out and "2026-11-02 00:01:01 UTC" in out
    listed = json.loads(run(url, "quarantine", "list", "--format", "json")[1])
    assert listed == [
        {"limit": "api", "subject": "org-1", "quarantined_at": "2026-11-02T00:01:01+00:00"}
    ]
    assert run(url, "quarantine", "release", "org-1", "api") == (0, "released org-1 on api\n")
    assert run(url, "quarantine", "list")[1] == "no subject is quarantined\n"
    code, out = run(url, "quarantine", "release", "org-1", "api")
    assert code == 1 and "'org-1' is not quarantined on 'api'" in out
    code, out = run(url, "quarantine", "release", "org-1", "nope")
    assert code == 1 and "unknown limit 'nope'" in out


def test_a_limits_file_takes_a_breaker(url: str, tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(
        "api:\n  maximum: 1000\n  period: 1d\n  breaker: 5x\n"
        "  breaker_floor: 0.25\n  quarantine_max: 10\n"
    )
    code, out = run(url, "limits", "load", str(path))
    assert code == 0, out
    with Meter(url) as meter:
        limit = meter.get_limit("api")
    assert (limit.breaker, limit.breaker_floor, limit.quarantine_max) == ("5x", 0.25, 10)
    path.write_text("api:\n  maximum: 1000\n  period: 1d\n  breaker: 1x\n")
    code, out = run(url, "limits", "load", str(path))
    assert code == 1 and "breaker" in out
