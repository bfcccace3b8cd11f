"""``metering simulate`` through click's CliRunner on a SQLite file: the three
formats carry the same columns and figures, a progress bar when asked, and
every bad input is one ``error:`` line, exit 1, with nothing stored changed."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from metering import Limit, Meter
from metering.cli import main
from metering.domain.replay import SIMULATION_COLUMNS

EXPECTED = {
    "subject": "org-1",
    "limit": "calls",
    "events": 5,
    "would_deny_events": 3,
    "would_deny_cost": 3,
    "overage": 0,
    "denied_events_then": 2,
}


@pytest.fixture
def url(sqlite_url: str) -> str:
    url = sqlite_url
    with Meter(url) as meter:
        meter.set_limit(Limit("calls", maximum=3, period="1h", window="calendar"))
        for _ in range(5):
            meter.consume("org-1", "calls")
    return url


@pytest.fixture
def proposed(tmp_path: Path) -> Path:
    path = tmp_path / "proposed.yaml"
    path.write_text("calls:\n  maximum: 2\n  period: 1h\n  window: calendar\n")
    return path


def simulate(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--database", url, "simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_formats_show_the_same_figures(url: str, proposed: Path) -> None:
    base = ("--limits", str(proposed), "--since", "1d")
    code, out, _ = simulate(url, *base, "--format", "json")
    assert code == 0 and json.loads(out)["rows"] == [EXPECTED]
    code, out, _ = simulate(url, *base, "--format", "csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows == [list(SIMULATION_COLUMNS), [str(v) for v in EXPECTED.values()]]
    code, out, _ = simulate(url, *base, "--progress")
    assert code == 0
    assert "_" not in out.splitlines()[1], out  # headers are words, as the other tables'
    for words in ("would-deny events", "would-deny cost", "denied events then"):
        assert words in " ".join(out.split()) or all(w in out for w in words.split()), out
    assert out.splitlines()[2].startswith("org-1 ")  # piped: plain text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "xml"), "'xml' is not one of"),
        (("--since", "2999-01-01"), "in the future"),
        (("--since", "yesterday"), "--since"),
        (("--since", "3mo"), "not months"),
        (("--since", "500d"), "no longer holds"),  # results are kept 400 days
        (("--limits", "broken.yaml"), "not valid YAML"),
        (("--limits", "missing.yaml"), "cannot read"),
        (("--entitlements", "unknown.yaml"), "no limit named 'nope'"),
        (("--subject", "bad\nsubject"), "subject"),
    ],
)
def test_bad_input_is_one_error_line(
    url: str, proposed: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    (tmp_path / "broken.yaml").write_text("calls: [maximum: 3\n")
    (tmp_path / "unknown.yaml").write_text("- {subject: s, limit: nope, maximum: 3}\n")
    options = {"--limits": str(proposed), "--since": "1d"}
    for name, value in zip(args[::2], args[1::2], strict=True):
        options[name] = str(tmp_path / value) if value.endswith(".yaml") else value
    with Meter(url) as meter:
        before = (meter.count_results(), meter.counters())
    code, out, err = simulate(url, *[part for pair in options.items() for part in pair])
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    with Meter(url) as meter:
        assert (meter.count_results(), meter.counters()) == before
