"""Every table fits 80 and 100 columns, even with names too long to stay
whole (the last resort: they fold, and read down they are whole); piped,
nothing is folded or cut."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from table_layout import capture_tables, columns_of, render

from metering import Limit, Meter
from metering.apikeys import ApiKeys
from metering.cli import main
from metering.cli.output import window_span
from metering.webhooks import Webhooks

LONG_SUBJECT = "alice@initech-corporation-emea.example"
ORG = "org-acme-corporation-emea"
LIMIT = "api_calls_monthly_per_org"
MESSAGES = "send_message"
SHADOW = "exports_shadow_trial"
URL = "https://hooks.example.com/metering/incoming/a-rather-long-path-for-hooks"
BIG = 1_234_567


@pytest.fixture
def url(sqlite_url: str) -> str:
    url = sqlite_url
    with Meter(url) as meter:
        meter.set_limits(
            [
                Limit(
                    LIMIT,
                    1_000_000,
                    "1mo",
                    window="calendar",
                    enforcement="soft",
                    thresholds=(80, 100),
                    thresholds_units=(900_000,),
                    dimensions=("route", "model"),
                ),
                Limit(MESSAGES, 5, "1m"),
                Limit("search", 10, "10s", algorithm="token_bucket"),
                Limit(SHADOW, 3, "1d", window="calendar", enforcement="shadow"),
            ]
        )
        Webhooks(meter).add(URL, types=["limit.denied", "limit.threshold", "limit.exceeded"])
        meter.set_entitlement(ORG, LIMIT, 1_000_001)
        meter.grant(ORG, LIMIT, 250_000, reason="a goodwill credit for the outage in November")
        meter.consume(ORG, LIMIT, cost=BIG, event_id="big-event-for-the-whole-org-0001")
        for number in range(7):
            meter.consume(LONG_SUBJECT, MESSAGES, event_id=f"message-{number}")
            meter.consume(LONG_SUBJECT, SHADOW, event_id=f"export-{number}")
            meter.consume(LONG_SUBJECT, "search", event_id=f"search-{number}")
        meter.void("message-0", "sent twice by a retrying client, see ticket 4711")
        meter.reserve(
            charges=[(LONG_SUBJECT, MESSAGES, 1), (LONG_SUBJECT, SHADOW, 2)],
            event_id="reservation-0001",
        )
        ApiKeys(meter).create("admin", "the billing team's reporting job")
    return url


COMMANDS = {
    "counters": ["counters"],
    "limits": ["limits", "list"],
    "entitlements": ["entitlements", "list"],
    "grants": ["grants", "list"],
    "corrections": ["corrections", "list"],
    "reservations": ["reservations", "list"],
    "endpoints": ["webhooks", "list"],
    "deliveries": ["webhooks", "deliveries"],
    "api keys": ["apikeys", "list"],
    "overage": ["report", "overage"],
    "usage": ["report", "usage", "--subject", ORG],
    "by dimension": ["report", "usage", "--subject", ORG, "--group-by", "route"],
    "shadow": ["report", "shadow", "--limit", SHADOW],
}


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_table_fits_and_reads_whole(
    url: str, name: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = capture_tables(monkeypatch, width)
    result = CliRunner().invoke(main, ["--database", url, *COMMANDS[name]])
    assert result.exit_code == 0, result.output
    [shown] = printed
    lines = render(shown, width)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width, text
    cells = columns_of(shown, lines)
    for index, column in enumerate(shown.columns):
        values = [str(cell) for cell in column.cells]
        parts = [row[index] for row in cells if row[index]]
        if column.no_wrap:  # a name or a number: whole, on one line
            assert parts == values, (str(column.header), text)
        else:  # a time, free text (names, as a last resort): wrapped or folded
            assert "".join(" ".join(parts).split()) == "".join(" ".join(values).split()), text


def test_piped_the_numbers_and_the_window_read_whole(url: str) -> None:
    result = CliRunner().invoke(main, ["--database", url, "report", "overage"])
    assert result.exit_code == 0, result.output
    assert f"{BIG:,}" in result.output and "1,000,001" in result.output
    assert f"{datetime.now(UTC):%Y-%m}" in result.output
    assert LONG_SUBJECT in result.output and "━" not in result.output


def test_a_window_reads_in_one_cell() -> None:
    day = datetime(2026, 11, 26, tzinfo=UTC)
    minute = timedelta(minutes=1)
    assert window_span(None, None) is None
    assert window_span(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)) == (
        "2026-11"
    )
    quarter = window_span(datetime(2026, 10, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert quarter == "2026-10\u20132026-12"
    assert window_span(day, day + timedelta(days=1)) == "2026-11-26"
    assert window_span(day, day + timedelta(days=7)) == "2026-11-26\u20132026-12-02"
    start = day + timedelta(hours=9, minutes=33, seconds=40)
    assert window_span(start, start + minute) == "2026-11-26 09:33:40\u201309:34:40"
    assert window_span(start, start + timedelta(days=1), minute) == (
        "2026-11-26 09:34\u20132026-11-27 09:34"
    )
