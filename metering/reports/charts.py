"""Charts of reports (PNG, SVG or PDF, by the file's suffix: `chart_format`).

Every chart shows usage against the maximum that applied, the overage (billable usage beyond
it, soft limits) in its own colour and the denied cost (refused demand: never consumed, never
billed) outlined beyond it, with a legend naming each part. matplotlib is imported here
only, when a chart is asked for; figures are built directly on the Agg canvas (no
``pyplot``), so no global backend state is touched and nothing opens a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metering.domain.instants import clock_text
from metering.errors import ConfigurationError, InvalidInput
from metering.reports.overage import ReportRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DEFAULT_TOP: Final = 10
UNDER: Final = "#4c72b0"
GRANTED: Final = "#8fb0d9"
OVER: Final = "#dd8452"
LIMIT_LINE: Final = "#c44e52"
DPI: Final = 100
# The files a chart can be written as: the suffix picks the format.
CHART_FORMATS: Final = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
# The legend's words, one for each part of a bar.
USED_LABEL: Final = "used within the maximum"
GRANTED_LABEL: Final = "used, paid by grants"
OVERAGE_LABEL: Final = "overage (billable)"
DENIED_LABEL: Final = "denied (not consumed, not billed)"


def chart_format(path: str | Path) -> str:
    """The format a chart file's suffix asks for (png, svg or pdf); `InvalidInput`
    for any other, so a ``.txt`` never receives PNG bytes."""
    suffix = Path(path).suffix.lower()
    found = CHART_FORMATS.get(suffix)
    if found is None:
        named = f"a {suffix} file" if suffix else "a file without a suffix"
        raise InvalidInput("chart", f"{path}: charts are .png, .svg or .pdf files, not {named}")
    return found


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


def _empty(figure: Figure, title: str) -> Figure:
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.text(0.5, 0.5, "no windows in this period", ha="center", va="center")
    axes.set_axis_off()
    return figure


def _legend(axes: Axes, **placement: Any) -> None:
    """A legend in the order a bar reads: the parts of the usage, the denied
    cost, then the maximum's line."""
    handles, labels = axes.get_legend_handles_labels()
    ordered = sorted(
        zip(handles, labels, strict=True), key=lambda pair: pair[1].startswith("maximum")
    )
    axes.legend([h for h, _ in ordered], [label for _, label in ordered], fontsize=8, **placement)


def _parts(row: ReportRow) -> tuple[int, int, int]:
    """``used`` split into the window's own usage within the maximum, the part
    grants paid, and what is billed beyond the maximum: a soft limit's
    overage, a hard limit's overdraft."""
    beyond = row.overage + row.overdraft
    return row.used - row.granted - beyond, row.granted, beyond


def window_labels(rows: Sequence[ReportRow]) -> list[str]:
    """``subject · limit · day`` for each row; the window's start time too
    (``HH:MM:SS``, UTC, `clock_text`) where two of the windows start on the same day."""
    starts_by_day: dict[object, set[datetime]] = {}
    for r in rows:
        starts_by_day.setdefault(r.window_start.date(), set()).add(r.window_start)

    def start(r: ReportRow) -> str:
        if len(starts_by_day[r.window_start.date()]) == 1:
            return f"{r.window_start:%Y-%m-%d}"
        return clock_text(r.window_start)

    return [f"{r.subject} · {r.limit} · {start(r)}" for r in rows]


def overage_figure(rows: Sequence[ReportRow], period_label: str) -> Figure:
    """Horizontal bars, one per row: its usage against its maximum (100%),
    split into the usage within the maximum, the part grants paid and the
    overage (billable), with the denied cost (not consumed) beyond them as an
    outline; a legend names each part."""
    title = f"Usage against the maximum, the top {len(rows)} by overage, {period_label}"
    figure = _figure(10, 1.8 + 0.45 * max(len(rows), 1))
    if not rows:
        return _empty(figure, title)
    axes = figure.add_subplot()
    shown = list(reversed(rows))  # largest overage at the top
    positions = range(len(shown))

    def percent(amount: int, row: ReportRow) -> float:
        return amount * 100 / row.maximum

    left = [0.0] * len(shown)
    parts = ((0, USED_LABEL, UNDER), (1, GRANTED_LABEL, GRANTED), (2, OVERAGE_LABEL, OVER))
    for index, label, colour in parts:
        widths = [percent(_parts(r)[index], r) for r in shown]
        if index and not any(widths):
            continue  # no grants, or no overage: nothing to draw or name
        axes.barh(positions, widths, left=left, color=colour, label=label)
        left = [start + width for start, width in zip(left, widths, strict=True)]
    denied = [percent(r.denied, r) for r in shown]
    if any(denied):
        axes.barh(
            positions,
            denied,
            left=left,
            color="none",
            edgecolor=LIMIT_LINE,
            hatch="//",
            label=DENIED_LABEL,
        )
    ends = [start + extra for start, extra in zip(left, denied, strict=True)]
    for position, end, row in zip(positions, ends, shown, strict=True):
        axes.annotate(
            _bar_note(row),
            (end, position),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    axes.set_yticks(positions, window_labels(shown))
    axes.axvline(100, color=LIMIT_LINE, linestyle="--", label="maximum (100%)")
    axes.set_xlim(0, max([*ends, 100.0]) * 1.5)  # room for the notes
    axes.set_xlabel("usage, % of the maximum that applied")
    axes.set_title(title)
    # Below the bars, never over a bar's note.
    _legend(axes, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2)
    return figure


def _bar_note(row: ReportRow) -> str:
    note = f"{row.used:,}/{row.maximum:,}"
    if row.overage:
        note += f", overage {row.overage:,}"
    if row.denied_events:
        events = "event" if row.denied_events == 1 else "events"
        note += f", denied {row.denied:,} ({row.denied_events:,} {events})"
    return note


def usage_figure(rows: Sequence[ReportRow], subject: str, period_label: str) -> Figure:
    """One panel per limit: used per window over time against the maximum,
    split as in `overage_figure` (within the maximum, paid by grants,
    overage), the denied cost outlined on top; a legend in each panel."""
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
    bottom = [0] * len(windows)
    parts = ((0, USED_LABEL, UNDER), (1, GRANTED_LABEL, GRANTED), (2, OVERAGE_LABEL, OVER))
    for index, label, colour in parts:
        heights = [_parts(w)[index] for w in windows]
        if index and not any(heights):
            continue  # no grants, or no overage: nothing to draw or name
        axes.bar(
            starts,  # type: ignore[arg-type]
            heights,
            bottom=bottom,
            width=widths,  # type: ignore[arg-type]
            align="edge",
            color=colour,
            edgecolor="white",
            linewidth=0.5,
            label=label,
        )
        bottom = [below + height for below, height in zip(bottom, heights, strict=True)]
    if any(w.denied for w in windows):
        axes.bar(
            starts,  # type: ignore[arg-type]
            [w.denied for w in windows],
            bottom=bottom,
            width=widths,  # type: ignore[arg-type]
            align="edge",
            color="none",
            edgecolor=LIMIT_LINE,
            hatch="//",
            label=DENIED_LABEL,
        )
    maximum = windows[-1].maximum
    if all(w.maximum == maximum for w in windows):
        axes.axhline(
            maximum, color=LIMIT_LINE, linestyle="--", label=f"maximum {maximum:,}", zorder=3
        )
    else:  # entitlements changed: each window's own maximum, the one that applied
        axes.hlines(
            [w.maximum for w in windows],
            starts,  # type: ignore[arg-type]
            [w.window_end for w in windows],  # type: ignore[arg-type]
            color=LIMIT_LINE,
            linestyle="--",
            label=f"maximum per window (last {maximum:,})",
            zorder=3,
        )
    axes.set_ylabel("used")
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.set_title(f"{limit} ({windows[-1].enforcement})", loc="left", fontsize=10)
    highest = max(w.used + w.denied for w in windows)
    axes.set_ylim(0, max(highest, *(w.maximum for w in windows)) * 1.15)
    _legend(axes, loc="upper left")


def _date_axis(axes: Axes) -> None:
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    axes.set_xlabel("window start (UTC)")


def save(figure: Figure, path: str | Path) -> Path:
    """Write ``figure`` in the format its suffix names (`chart_format`)."""
    target = Path(path)
    chosen = chart_format(target)
    try:
        figure.savefig(target, format=chosen)
    except OSError as exc:
        raise InvalidInput("chart", f"cannot write {target}: {exc.strerror or exc}") from exc
    return target


def overage_chart(rows: Sequence[ReportRow], path: str | Path, period_label: str) -> Path:
    """Draw `overage_figure` of ``rows`` (the report's first rows) into a PNG,
    SVG or PDF file, as its suffix says."""
    return save(overage_figure(rows, period_label), path)


def usage_chart(
    rows: Sequence[ReportRow], path: str | Path, subject: str, period_label: str
) -> Path:
    """Draw `usage_figure` of a usage report into a PNG, SVG or PDF file."""
    return save(usage_figure(rows, subject, period_label), path)
