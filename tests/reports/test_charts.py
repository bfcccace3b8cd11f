"""The PNG charts: valid files, and the figures drawn from a known data set."""

from __future__ import annotations

import dataclasses
import struct
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from metering import Meter
from metering.cli import main
from metering.errors import InvalidInput
from metering.reports import ReportRow
from metering.reports.charts import (
    overage_chart,
    overage_figure,
    usage_chart,
    usage_figure,
    window_labels,
)

if TYPE_CHECKING:  # matplotlib is imported by the charts drawn, not by collection
    from matplotlib.axes import Axes
    from matplotlib.patches import Rectangle

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
    denied: int = 0,
    end: datetime | None = None,
) -> ReportRow:
    overage = max(used - maximum, 0) if enforcement == "soft" else 0
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
        overdraft=0,
        denied=denied,
        denied_events=1 if denied else 0,
        utilisation_percent=round(used * 100 / maximum, 2),
        first_denied_at=start + timedelta(days=3) if denied else None,
    )


NOV = datetime(2026, 11, 1, tzinfo=UTC)
TOP = [
    row("org-a", "api_calls", NOV, 250),
    row("org-b", "exports", NOV, 10, maximum=10, enforcement="hard", denied=40),
    row("org-c", "api_calls", NOV, 90),
]


def legend_labels(axes: Axes) -> list[str]:
    legend = axes.get_legend()
    assert legend is not None
    return [text.get_text() for text in legend.get_texts()]


def bars(axes: Axes, label: str) -> list[Rectangle]:
    """The bars of one legend entry (a `BarContainer` by its label)."""
    [found] = [c for c in axes.containers if c.get_label() == label]
    return list(found)


def test_overage_figure_shows_used_against_the_maximum_and_marks_the_overage() -> None:
    figure = overage_figure(TOP, "2026-11")
    [axes] = figure.axes
    assert "2026-11" in axes.get_title() and "top 3" in axes.get_title()
    assert legend_labels(axes) == [
        "used within the maximum",
        "overage (billable)",
        "denied (not consumed, not billed)",
        "maximum (100%)",
    ]
    # Bottom to top: org-c, org-b, org-a (the largest overage drawn at the top).
    within = [bar.get_width() for bar in bars(axes, "used within the maximum")]
    overage = bars(axes, "overage (billable)")
    denied = bars(axes, "denied (not consumed, not billed)")
    assert within == [90.0, 100.0, 100.0]
    assert [bar.get_width() for bar in overage] == [0.0, 0.0, 150.0]
    assert overage[2].get_x() == 100.0  # the overage starts at the maximum
    # The hard limit's 40 denied (400% of its 10) sit beyond its usage, outlined:
    assert [(bar.get_x(), bar.get_width()) for bar in denied][1] == (100.0, 400.0)
    assert [bar.get_width() for bar in denied][0::2] == [0.0, 0.0]
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels[-1] == "org-a · api_calls · 2026-11-01"
    assert [line.get_xdata()[0] for line in axes.get_lines()] == [100]  # the maximum
    notes = [text.get_text() for text in axes.texts]
    assert "250/100, overage 150" in notes
    assert "10/10, denied 40 (1 event)" in notes  # denials are not overage
    assert "maximum" in axes.get_xlabel()


def test_overage_figure_gives_the_start_time_where_two_windows_share_a_day() -> None:
    morning = datetime(2026, 11, 3, 9, 15, tzinfo=UTC)
    rows = [
        row("org-a", "exports", morning, 12, maximum=10),
        row("org-a", "exports", morning + timedelta(hours=8), 11, maximum=10),
        row("org-b", "exports", NOV, 11, maximum=10),
    ]
    [axes] = overage_figure(rows, "2026-11").axes
    assert [label.get_text() for label in axes.get_yticklabels()] == [
        "org-b · exports · 2026-11-01",
        "org-a · exports · 2026-11-03 17:15:00",
        "org-a · exports · 2026-11-03 09:15:00",
    ]
    assert window_labels(rows[2:]) == ["org-b · exports · 2026-11-01"]


def test_the_legend_names_grants_only_when_a_grant_paid() -> None:
    granted = dataclasses.replace(TOP[0], used=300, granted=50, overage=150)
    [axes] = overage_figure([granted], "2026-11").axes
    assert legend_labels(axes) == [
        "used within the maximum",
        "used, paid by grants",
        "overage (billable)",
        "maximum (100%)",
    ]
    widths = [
        bars(axes, label)[0].get_width()
        for label in ("used within the maximum", "used, paid by grants", "overage (billable)")
    ]
    assert widths == [100.0, 50.0, 150.0]


def test_usage_figure_has_a_panel_per_limit_with_its_limit_line_and_dates() -> None:
    months = [datetime(2026, m, 1, tzinfo=UTC) for m in (9, 10, 11)]
    usage = zip(months, (80, 120, 250), strict=True)
    rows = [row("org-a", "api_calls", start, used) for start, used in usage]
    rows += [
        row("org-a", "seats", NOV, 5, maximum=5, enforcement="hard", denied=2),
    ]
    figure = usage_figure(rows, "org-a", "2026-09-01 to 2026-11-30")
    panels = figure.axes
    assert len(panels) == 2
    assert "org-a" in figure.get_suptitle() and "2026-09-01" in figure.get_suptitle()
    calls, seats = panels
    assert calls.get_title(loc="left") == "api_calls (soft)"
    assert legend_labels(calls) == [
        "used within the maximum",
        "overage (billable)",
        "maximum 100",
    ]
    assert [p.get_height() for p in bars(calls, "used within the maximum")] == [80, 100, 100]
    assert [p.get_height() for p in bars(calls, "overage (billable)")] == [0, 20, 150]
    assert [line.get_ydata()[0] for line in calls.get_lines()] == [100]
    assert legend_labels(seats) == [
        "used within the maximum",
        "denied (not consumed, not billed)",
        "maximum 5",
    ]
    [denied] = bars(seats, "denied (not consumed, not billed)")
    assert (denied.get_y(), denied.get_height()) == (5, 2)  # on top of the usage
    assert [line.get_ydata()[0] for line in seats.get_lines()] == [5]
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
    assert legend_labels(calls) == [
        "used within the maximum",
        "used, paid by grants",
        "maximum per window (last 1,000)",
    ]  # no overage: the grant paid what was beyond the maximum
    assert [p.get_height() for p in bars(calls, "used within the maximum")] == [90, 180, 250]
    assert [p.get_height() for p in bars(calls, "used, paid by grants")] == [30, 0, 0]
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


@pytest.mark.parametrize(
    ("name", "signature"), [("chart.svg", b"<?xml"), ("chart.pdf", b"%PDF"), ("c.PNG", b"\x89PNG")]
)
def test_the_chart_files_suffix_picks_its_format(
    sqlite_ledger: Meter, tmp_path: Path, name: str, signature: bytes
) -> None:
    target = tmp_path / name
    args = ["--database", sqlite_ledger.url, "report", "overage", "--chart", str(target)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert target.read_bytes().startswith(signature)


@pytest.mark.parametrize("name", ["chart.txt", "chart", "chart.png.csv", "chart.jpg"])
def test_a_chart_file_of_another_kind_is_refused_before_any_output(
    sqlite_ledger: Meter, tmp_path: Path, name: str
) -> None:
    target = tmp_path / name
    for command in (["overage"], ["usage", "--subject", "org-a"]):
        args = ["--database", sqlite_ledger.url, "report", *command, "--chart", str(target)]
        result = CliRunner().invoke(main, [*args, "--format", "csv"])
        assert result.exit_code == 1 and result.stdout == "" and not target.exists()
        [line] = result.stderr.splitlines()
        assert line.startswith("error: Invalid value for '--chart': ") and (
            "charts are .png, .svg or .pdf files" in line
        ), line
    with pytest.raises(InvalidInput, match=r"charts are \.png, \.svg or \.pdf files"):
        overage_chart(TOP, target, "2026-11")
    assert not target.exists()
