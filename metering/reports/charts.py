"""PNG charts of reports, drawn with matplotlib's Agg canvas (no display needed).

matplotlib is imported here only, when a chart is asked for: the rest of
`metering` never pays for it. Figures are built directly (no ``pyplot``), so
no global backend state is touched and nothing opens a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Final

from metering.errors import ConfigurationError, InvalidInput
from metering.reports.overage import ReportRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DEFAULT_TOP: Final = 10
UNDER: Final = "#4c72b0"
OVER: Final = "#dd8452"
LIMIT_LINE: Final = "#c44e52"
DPI: Final = 100


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigurationError(
            "charts need matplotlib, an optional extra: pip install 'metering[charts]'"
        ) from None

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _over(row: ReportRow) -> bool:
    # Grant-paid usage is not over: only the window's own usage counts.
    return row.overage > 0 or row.used - row.granted > row.maximum


def _empty(figure: Figure, title: str) -> Figure:
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.text(0.5, 0.5, "no windows in this period", ha="center", va="center")
    axes.set_axis_off()
    return figure


def overage_figure(rows: Sequence[ReportRow], period_label: str) -> Figure:
    """Horizontal bars: each row's utilisation of its limit, the limit at 100%."""
    title = f"Utilisation of the top {len(rows)} by overage, {period_label}"
    figure = _figure(10, 1.6 + 0.45 * max(len(rows), 1))
    if not rows:
        return _empty(figure, title)
    axes = figure.add_subplot()
    shown = list(reversed(rows))  # largest overage at the top
    labels = [f"{r.subject} · {r.limit} · {r.window_start:%Y-%m-%d}" for r in shown]
    values = [r.utilisation_percent for r in shown]
    colours = [OVER if _over(r) else UNDER for r in shown]
    bars = axes.barh(range(len(shown)), values, color=colours)
    axes.set_yticks(range(len(shown)), labels)
    axes.axvline(100, color=LIMIT_LINE, linestyle="--", label="limit (100% of maximum)")
    notes = [_bar_note(r) for r in shown]
    axes.bar_label(bars, notes, padding=3, fontsize=8)
    axes.set_xlim(0, max([*values, 100.0]) * 1.5)  # room for the notes
    axes.set_xlabel("utilisation of the limit (%)")
    axes.set_title(title)
    axes.legend(loc="lower right")
    return figure


def _bar_note(row: ReportRow) -> str:
    note = f"{row.used:,}/{row.maximum:,}"
    if row.overage:
        note += f", overage {row.overage:,}"
    if row.denied_events:
        note += f", {row.denied_events:,} denied"
    return note


def usage_figure(rows: Sequence[ReportRow], subject: str, period_label: str) -> Figure:
    """One panel per limit: used per window over time, and the limit line."""
    title = f"Usage of {subject}, {period_label}"
    by_limit = [(name, list(group)) for name, group in groupby(rows, key=lambda r: r.limit)]
    figure = _figure(10, 0.8 + 2.6 * max(len(by_limit), 1))
    if not by_limit:
        return _empty(figure, title)
    panels = figure.subplots(len(by_limit), 1, sharex=True, squeeze=False)[:, 0]
    for axes, (name, windows) in zip(panels, by_limit, strict=True):
        _usage_panel(axes, name, windows)
    _date_axis(panels[-1])
    figure.suptitle(title)
    return figure


def _usage_panel(axes: Axes, limit: str, windows: Sequence[ReportRow]) -> None:
    starts = [w.window_start for w in windows]
    widths = [w.window_end - w.window_start for w in windows]
    colours = [OVER if _over(w) else UNDER for w in windows]
    axes.bar(
        starts,  # type: ignore[arg-type]
        [w.used for w in windows],
        width=widths,  # type: ignore[arg-type]
        align="edge",
        color=colours,
        edgecolor="white",
        linewidth=0.5,
    )
    if any(w.denied_cost for w in windows):
        axes.bar(
            starts,  # type: ignore[arg-type]
            [w.denied_cost for w in windows],
            bottom=[w.used for w in windows],
            width=widths,  # type: ignore[arg-type]
            align="edge",
            color="none",
            edgecolor=LIMIT_LINE,
            hatch="//",
            label="denied (not consumed)",
        )
    maximum = windows[-1].maximum
    if all(w.maximum == maximum for w in windows):
        axes.axhline(
            maximum, color=LIMIT_LINE, linestyle="--", label=f"limit {maximum:,}", zorder=3
        )
    else:  # entitlements changed: each window's own maximum, the one that applied
        axes.hlines(
            [w.maximum for w in windows],
            starts,  # type: ignore[arg-type]
            [w.window_end for w in windows],  # type: ignore[arg-type]
            color=LIMIT_LINE,
            linestyle="--",
            label=f"limit per window (last {maximum:,})",
            zorder=3,
        )
    axes.set_ylabel("used")
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set_title(f"{limit} ({windows[-1].enforcement})", loc="left", fontsize=10)
    highest = max(w.used + w.denied_cost for w in windows)
    axes.set_ylim(0, max(highest, *(w.maximum for w in windows)) * 1.15)
    axes.legend(loc="upper left")


def _date_axis(axes: Axes) -> None:
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    axes.set_xlabel("window start (UTC)")


def save(figure: Figure, path: str | Path) -> Path:
    """Write ``figure`` as a PNG."""
    target = Path(path)
    try:
        figure.savefig(target, format="png")
    except OSError as exc:
        raise InvalidInput("chart", f"cannot write {target}: {exc.strerror or exc}") from exc
    return target


def overage_chart(rows: Sequence[ReportRow], path: str | Path, period_label: str) -> Path:
    """Draw `overage_figure` of ``rows`` (the report's first rows) into a PNG file."""
    return save(overage_figure(rows, period_label), path)


def usage_chart(
    rows: Sequence[ReportRow], path: str | Path, subject: str, period_label: str
) -> Path:
    """Draw `usage_figure` of a usage report into a PNG file."""
    return save(usage_figure(rows, subject, period_label), path)
