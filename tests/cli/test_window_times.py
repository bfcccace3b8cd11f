"""One way of showing a window's bounds: the counters listing, the overage
report's table and the report chart's labels show the true start and end to
the second, rounded up (`metering.domain.instants.clock_text`); CSV carries
the exact instants.

A 1-minute window that its first event opened at 13:33:19.25 (a
``first_use`` window starts at its first event) reads 13:33:19.25 → ``13:33:20`` and
ends a minute later, ``13:34:20``, everywhere; none rounds it to the minute.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from metering import FrozenClock, Limit, Meter
from metering.cli import main
from metering.reports import select_overage
from metering.reports.charts import window_labels

DASH = "\N{EN DASH}"
OPENED = datetime(2026, 11, 26, 13, 33, 19, 250_000, tzinfo=UTC)


def _run(url: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--database", url, *args], env={"COLUMNS": "160"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_every_surface_shows_the_same_window_bounds(sqlite_url: str) -> None:
    url = sqlite_url
    with Meter(url, clock=FrozenClock(OPENED)) as meter:
        meter.set_limit(
            Limit("calls", maximum=1, period="1m", window="first_use", enforcement="soft")
        )
        meter.consume("org-1", "calls", 3, event_id="e-1")  # 3 > 1: overage
        rows = list(select_overage(meter, period="2026-11").rows())
    assert [r.window_start for r in rows] == [OPENED]

    counters = _run(url, "counters")
    report = _run(url, "report", "overage", "--period", "2026-11")
    listed = _run(url, "report", "overage", "--period", "2026-11", "--format", "csv")
    for shown in (counters, report):
        assert f"2026-11-26 13:33:20{DASH}13:34:20" in shown, shown
        assert f"13:34{DASH}" not in shown and f"13:33{DASH}" not in shown
    (row,) = csv.DictReader(io.StringIO(listed))
    # CSV is data: the exact instants.
    assert (row["window_start"], row["window_end"]) == (
        "2026-11-26T13:33:19.250000+00:00",
        "2026-11-26T13:34:19.250000+00:00",
    )
    # Two windows starting on one day: the chart labels each by its start, as above.
    later = replace(rows[0], window_start=OPENED + timedelta(minutes=5))
    assert window_labels([rows[0], later])[0] == "org-1 · calls · 2026-11-26 13:33:20"
