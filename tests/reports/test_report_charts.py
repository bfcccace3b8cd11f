"""The PNG charts: valid files, and the figures drawn from a known data set."""

from __future__ import annotations

import dataclasses
import struct
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from metering import Meter
from metering.cli import main
from metering.reports import ReportRow
from metering.reports.charts import overage_chart, overage_figure, usage_chart, usage_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Check the PNG signature and that IHDR comes first; return (width, height)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    assert data[-12:-8] == b"\x00\x00\x00\x00" and data[-8:-4] == b"IEND"
    return width, height


def sensible(size: tuple[int, int]) -> bool:
    width, height = size
    return 400 <= width <= 4000 and 200 <= height <= 4000


def row(
    subject: str,
    limit: str,
    start: datetime,
    used: int,
    maximum: int = 100,
    enforcement: str = "soft",
    denied_cost: int = 0,
    end: datetime | None = None,
) -> ReportRow:
    overage = max(used - maximum, 0) if enforcement == "soft" else denied_cost
    return ReportRow(
        subject=subject,
        limit=limit,
        enforcement=enforcement,
        window_start=start,
        window_end=end or start + timedelta(days=30),
        maximum=maximum,
        used=used,
        granted=0,
        overage=overage,
        denied_events=1 if denied_cost else 0,
        denied_cost=denied_cost,
        utilisation_percent=round(used * 100 / maximum, 2),
        first_denied_at=start + timedelta(days=3) if denied_cost else None,
    )


NOV = datetime(2026, 11, 1, tzinfo=UTC)
TOP = [
    row("org-a", "api_calls", NOV, 250),
    row("org-b", "exports", NOV, 10, maximum=10, enforcement="hard", denied_cost=40),
    row("org-c", "api_calls", NOV, 90),
]


def test_overage_figure_draws_one_bar_per_row_against_the_limit() -> None:
    figure = overage_figure(TOP, "2026-11")
    [axes] = figure.axes
    assert "2026-11" in axes.get_title() and "top 3" in axes.get_title()
    widths = [patch.get_width() for patch in axes.patches]
    assert widths == [90.0, 100.0, 250.0]  # largest overage drawn at the top
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels[-1] == "org-a · api_calls · 2026-11-01"
    assert [line.get_xdata()[0] for line in axes.get_lines()] == [100]  # the limit
    notes = [text.get_text() for text in axes.texts]
    assert "250/100, overage 150" in notes and "10/10, overage 40, 1 denied" in notes
    assert "utilisation" in axes.get_xlabel()


def test_usage_figure_has_a_panel_per_limit_with_its_limit_line_and_dates() -> None:
    months = [datetime(2026, m, 1, tzinfo=UTC) for m in (9, 10, 11)]
    usage = zip(months, (80, 120, 250), strict=True)
    rows = [row("org-a", "api_calls", start, used) for start, used in usage]
    rows += [
        row("org-a", "seats", NOV, 5, maximum=5, enforcement="hard", denied_cost=2),
    ]
    figure = usage_figure(rows, "org-a", "2026-09-01 to 2026-11-30")
    panels = figure.axes
    assert len(panels) == 2
    assert "org-a" in figure.get_suptitle() and "2026-09-01" in figure.get_suptitle()
    calls, seats = panels
    assert calls.get_title(loc="left") == "api_calls (soft)"
    assert [p.get_height() for p in calls.patches] == [80, 120, 250]
    assert [line.get_ydata()[0] for line in calls.get_lines()] == [100]
    assert [line.get_ydata()[0] for line in seats.get_lines()] == [5]
    assert len(seats.patches) == 2  # used, and the denied cost stacked on it
    figure.canvas.draw()
    ticks = [label.get_text() for label in seats.get_xticklabels() if label.get_text()]
    assert ticks and any(name in " ".join(ticks) for name in ("Sep", "Oct", "Nov"))
    assert "UTC" in seats.get_xlabel()


def test_usage_figure_draws_each_windows_own_maximum_when_entitlements_changed() -> None:
    months = [datetime(2026, m, 1, tzinfo=UTC) for m in (9, 10, 11)]
    rows = [
        row("org-a", "api_calls", start, used, maximum=maximum)
        for start, used, maximum in zip(months, (80, 180, 250), (100, 250, 1000), strict=True)
    ]
    # 120 used, 30 of it paid by a grant: not over its maximum of 100.
    rows[0] = dataclasses.replace(rows[0], used=120, granted=30, overage=0)
    [calls] = usage_figure(rows, "org-a", "2026").axes
    assert calls.get_lines() == []  # no single limit line ...
    [segments] = calls.collections  # ... but one segment per window, at its maximum
    assert [segment[0][1] for segment in segments.get_segments()] == [100, 250, 1000]
    assert [p.get_facecolor() for p in calls.patches] == [calls.patches[1].get_facecolor()] * 3
    assert calls.get_ylim()[1] == pytest.approx(1000 * 1.15)


def test_chart_files_are_valid_pngs(tmp_path: Path) -> None:
    assert sensible(png_size(overage_chart(TOP, tmp_path / "top.png", "2026-11")))
    usage = usage_chart(TOP[:1], tmp_path / "usage.png", "org-a", "2026-11")
    assert sensible(png_size(usage))
    assert sensible(png_size(overage_chart([], tmp_path / "empty.png", "2020-01")))
    assert sensible(png_size(usage_chart([], tmp_path / "none.png", "x", "2020-01")))


def test_chart_option_of_both_reports(sqlite_ledger: Meter, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--database", sqlite_ledger.url, "report"]
    top = tmp_path / "overage.png"
    args = ["overage", "--period", "2026-11", "--format", "csv", "--chart", str(top)]
    result = runner.invoke(main, [*base, *args])
    assert result.exit_code == 0, result.output
    assert f"chart written to {top}" in result.stderr
    assert sensible(png_size(top))
    usage = tmp_path / "usage.png"
    result = runner.invoke(main, [*base, "usage", "--subject", "org-a", "--chart", str(usage)])
    assert result.exit_code == 0, result.output
    assert sensible(png_size(usage))


def test_an_unwritable_chart_is_a_one_line_error(sqlite_ledger: Meter, tmp_path: Path) -> None:
    target = tmp_path / "missing" / "chart.png"
    args = ["--database", sqlite_ledger.url, "report", "overage", "--chart", str(target)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert (
        result.stderr.startswith("error: chart: cannot write") and "Traceback" not in result.output
    )


def test_without_the_charts_extra_a_chart_is_a_one_line_error_naming_it(
    sqlite_ledger: Meter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if matplotlib were not installed: importing any of it fails.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    target = tmp_path / "chart.png"
    args = ["--database", sqlite_ledger.url, "report", "overage", "--chart", str(target)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and not target.exists()
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error:") and "metering[charts]" in line
