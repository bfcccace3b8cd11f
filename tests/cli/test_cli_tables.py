"""Tables never cut ids, subjects or names: not in a narrow terminal, not in a pipe."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from table_layout import capture_tables, columns_of, render

from metering import Limit, Meter
from metering.cli import main, tables
from metering.webhooks import Webhooks

SUBJECT = "org-acme-corporation-emea"
LIMIT = "api_calls_monthly"
URL = "https://hooks.example.com/metering/incoming/very-long-path"


@pytest.fixture
def url(sqlite_url: str) -> str:
    url = sqlite_url
    with Meter(url) as meter:
        Webhooks(meter).add(URL, types=["limit.denied", "limit.threshold"])
        meter.set_limit(Limit(LIMIT, maximum=5, period="1mo", window="calendar", thresholds=(80,)))
        meter.consume(SUBJECT, LIMIT, cost=5)
        meter.consume(SUBJECT, LIMIT, cost=1)
    return url


def cut(text: str) -> bool:
    """Whether a cell was cut short (a masked secret, ``whsec_…1234``, is not)."""
    return "…" in re.sub(r"whsec_…[A-Za-z0-9+/=_-]+", "", text)


COMMANDS = {
    "counters": (["counters"], {0: SUBJECT, 1: LIMIT}),
    "limits": (["limits", "list"], {0: LIMIT}),
    "endpoints": (["webhooks", "list"], {1: URL}),
    "deliveries": (["webhooks", "deliveries"], {2: "ep_"}),
}


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_terminal_table_keeps_names_whole(
    url: str, name: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name may fold onto the next lines of its cell; read down, it is whole."""
    printed = capture_tables(monkeypatch, width)
    args, expected = COMMANDS[name]
    result = CliRunner().invoke(main, ["--database", url, *args])
    assert result.exit_code == 0, result.output
    [shown] = printed
    lines = render(shown, width)
    text = "\n".join(lines)
    assert not cut(text), text
    assert max(len(line) for line in lines) <= width
    cells = columns_of(shown, lines)
    for index, name_shown in expected.items():
        assert "".join(row[index] for row in cells).startswith(name_shown), text


def test_the_endpoint_id_stays_on_one_line_at_80_columns(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tables, "stdout_is_terminal", lambda: True)
    monkeypatch.setenv("COLUMNS", "80")
    with Meter(url) as meter:
        [endpoint] = Webhooks(meter).endpoints()
    result = CliRunner().invoke(main, ["--database", url, "webhooks", "list"])
    assert endpoint.id in result.output


@pytest.mark.parametrize("name", list(COMMANDS))
def test_piped_output_is_never_cut(url: str, name: str) -> None:
    args, expected = COMMANDS[name]
    result = CliRunner().invoke(main, ["--database", url, *args])
    assert result.exit_code == 0, result.output
    assert not cut(result.output), result.output
    for text in expected.values():
        assert text in result.output
    long_subject = "s" * 200
    with Meter(url) as meter:
        meter.consume(long_subject, LIMIT)
    counters = CliRunner().invoke(main, ["--database", url, "counters"]).output
    assert long_subject in counters
