"""The usage page a customer opens: ``GET /portal`` (docs/portal.md).

`portal_view` gathers one subject's figures (read-only but for recurring
grants falling due, as every listing of grants does); `render_page` turns
them into one self-contained HTML page: no script, inline CSS and SVG, a
viewport for phones. `make_link` and `subject_of_link` sign and check the
short-lived links ``metering portal link SUBJECT --ttl 1h`` prints, under a
secret kept in the database (`metering.storage.history.portal_secret`);
`rotate_link_secret` replaces it, the old one still opening the links it
signed until a grace ends (``metering portal rotate --grace 1d``).

Per limit: used against the maximum in force in the current window and what
that means in words (within, over and billed as overage, blocked until a
time), when it resets, the grants left (where the subject has grants), and a
chart with dates and values: the last 30 days by day (`metering.usage.history`),
or, for windows longer than a day with no hourly rollups, the last windows
one bar each (their counters hold no finer figure). Then the recent denials,
from the counters. Times are shown by `metering.domain.instants.clock_text`.
`render_refusal` is the page for a link that opens none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import Any, Final
from urllib.parse import quote

from metering.allowances.service import grants_left, list_grants
from metering.domain.bounds import shown
from metering.domain.definitions import Definition
from metering.domain.events import validate_subject
from metering.domain.history import Point, applied, maximum_at
from metering.domain.instants import clock_text, from_us
from metering.domain.limits import Limit
from metering.domain.links import (
    MAX_TTL_SECONDS,
    parse_ttl,
    public_url_problem,
    sign,
    validate_ttl,
    verify_any,
)
from metering.errors import InvalidInput
from metering.settings import public_url
from metering.storage.database import Database
from metering.storage.history import (
    WindowRow,
    counter_windows,
    entitlement_changes,
    portal_secret,
    portal_secrets,
    rotate_secret,
)
from metering.storage.limits import LimitStore
from metering.usage.current import subject_usage
from metering.usage.history import usage_history

DAYS: Final = 30
# Where a link points without a base URL or METERING_PUBLIC_URL: a local `metering serve`.
DEFAULT_BASE_URL: Final = "http://127.0.0.1:8000"
MAX_DENIALS: Final = 20
# A limit with windows longer than a day: its last windows, one bar each.
MAX_WINDOWS: Final = 6


@dataclass(frozen=True, slots=True)
class LimitPanel:
    name: str
    used: int
    maximum: int | None
    resets_at: datetime | None
    # None: the subject has no grant of this limit (the page says nothing of grants).
    grants_left: int | None
    # The bars: one per day, or one per window when the limit's windows are
    # longer than a day and no hourly rollups split them (``per == "window"``).
    days: list[Point]
    # The chart draws the maximum where it bounds a bar: a daily limit's days, any window.
    daily: bool = False
    enforcement: str = "hard"
    overage: int = 0
    retry_at: datetime | None = None
    per: str = "day"
    # When the allowance runs out at the recent rate, if before the reset.
    exhausts_at: datetime | None = None
    # The current window of a subject with a time zone, aligned at its local
    # midnight: the zone and its local label (`metering.domain.zones.window_label`).
    time_zone: str | None = None
    local_window: str | None = None


@dataclass(frozen=True, slots=True)
class PortalView:
    subject: str
    now: datetime
    limits: list[LimitPanel]
    denials: list[WindowRow]


def portal_view(database: Database, subject: str, days: int = DAYS) -> PortalView:
    """Everything the page shows of ``subject``, now."""
    validate_subject(subject)
    now_us = database.now_us()
    since_us = now_us - days * 86_400_000_000
    current = {u.limit.name: u for u in subject_usage(database, subject)}
    windows = database.read(lambda c: counter_windows(c, subject, None, since_us, now_us + 1))
    all_grants = list_grants(database, subject)
    grants = [g for g in all_grants if g.left > 0]
    granted = {g.limit for g in all_grants}
    names = sorted(set(current) | {w.limit for w in windows} | {g.limit for g in grants})
    now = from_us(now_us)
    left = grants_left(grants, now)
    changes = database.read(lambda c: {n: entitlement_changes(c, subject, n) for n in names})
    panels = []
    for name in names:
        history = usage_history(
            database, subject, name, since=now - timedelta(days=days - 1), until=now, bucket="day"
        )
        limit = history.limit
        default = limit.window_maximum
        maximum = maximum_at(changes[name], default, now_us)
        found = current.get(name)
        per_day = history.source == "rollups" or 0 < limit.period_seconds <= 86_400
        points = history.points
        if history.source == "counters" and not per_day:
            points = _window_points(database, subject, limit, now_us, changes[name])
        panels.append(
            LimitPanel(
                name=name,
                used=found.used if found is not None else 0,
                maximum=maximum,
                resets_at=found.resets_at if found is not None else None,
                grants_left=left.get(name, 0) if name in granted else None,
                days=points if history.source != "none" else [],
                daily=limit.period in ("1d", "24h") or not per_day,
                enforcement=limit.enforcement,
                overage=found.overage if found is not None else 0,
                retry_at=found.retry_at if found is not None else None,
                per="day" if per_day else "window",
                exhausts_at=found.exhausts_at if found is not None else None,
                time_zone=found.time_zone if found is not None else None,
                local_window=found.local_window if found is not None else None,
            )
        )
    denials = [w for w in reversed(windows) if w.denied_count > 0][:MAX_DENIALS]
    return PortalView(subject, now, panels, denials)


def _window_points(
    database: Database,
    subject: str,
    limit: Limit,
    now_us: int,
    changes: list[tuple[int, int | None]],
) -> list[Point]:
    """The last `MAX_WINDOWS` windows of a limit whose windows are longer than a
    day, one point each (the counters hold no finer figure), each with the
    maximum in force at its end."""
    since_us = now_us - MAX_WINDOWS * 31 * 86_400_000_000

    def read(connection: Any) -> tuple[list[WindowRow], list[Definition]]:
        rows = counter_windows(connection, subject, limit.name, since_us, now_us + 1)
        return rows, LimitStore(connection).definition_history([limit.name]).get(limit.name, [])

    rows, defaults = database.read(read)
    default = limit.window_maximum
    return [
        Point(
            r.window_start_us,
            r.window_end_us,
            r.used,
            applied(changes, defaults, default, r.window_end_us - 1),
        )
        for r in rows[-MAX_WINDOWS:]
    ]


# -- links ---------------------------------------------------------------------


def make_link(
    database: Database, subject: str, ttl_seconds: int, base_url: str | None = None
) -> str:
    """A link to ``subject``'s page that works for ``ttl_seconds``, under
    ``base_url``, else ``METERING_PUBLIC_URL``, else `DEFAULT_BASE_URL`;
    `InvalidInput` for a ``base_url`` that is no public URL (`public_url_problem`)."""
    validate_subject(subject)
    ttl = validate_ttl(ttl_seconds)
    if base_url is None:
        base_url = public_url() or DEFAULT_BASE_URL
    problem = public_url_problem(base_url)
    if problem is not None:
        raise InvalidInput("base_url", f"{shown(base_url)} {problem}")
    now_us = database.now_us()
    secret = database.run(lambda c: portal_secret(c, now_us))
    token = sign(secret, subject, now_us // 1_000_000 + ttl)
    return f"{base_url.rstrip('/')}/portal?token={quote(token)}"


def subject_of_link(database: Database, token: str) -> str | None:
    """The subject a link's token is for, or None (forged, expired, malformed):
    signed with the secret in use, or with the one a rotation replaced while
    its grace lasts."""
    now_us = database.now_us()
    keys = database.read(lambda c: portal_secrets(c, now_us))
    return verify_any(keys, token, now_us // 1_000_000)


def validate_grace(grace_seconds: object) -> int:
    """A rotation's grace: whole seconds, 0 (old links stop at once) to 31 days
    (no link lives longer)."""
    if (
        not isinstance(grace_seconds, int)
        or isinstance(grace_seconds, bool)
        or not 0 <= grace_seconds <= MAX_TTL_SECONDS
    ):
        raise InvalidInput("grace", f"must be 0 to 31 days in seconds; got {grace_seconds!r}")
    return grace_seconds


def parse_grace(text: str) -> int:
    """``0``, ``30m``, ``1h``, ``7d`` as seconds (at most 31 days)."""
    if text.strip() == "0":
        return 0
    try:
        return parse_ttl(text)
    except InvalidInput:
        raise InvalidInput(
            "grace", f"expected 0 or a duration like 30m, 1h or 7d (31 days at most); got {text!r}"
        ) from None


def rotate_link_secret(database: Database, grace_seconds: int) -> datetime:
    """Sign links with a new secret from now on; links signed with the one it
    replaces open the page until the instant returned (now + ``grace_seconds``),
    or their own expiry if sooner. Links of any earlier secret stop now."""
    grace = validate_grace(grace_seconds)
    now_us = database.now_us()
    until_us = now_us + grace * 1_000_000
    database.run(lambda c: rotate_secret(c, now_us, until_us))
    return from_us(until_us)


# -- the page ------------------------------------------------------------------

CSS: Final = """
body{font-family:system-ui,sans-serif;margin:0;padding:1rem;color:#222;background:#fafafa}
main{max-width:48rem;margin:auto}
h1{font-size:1.4rem;margin:0 0 .25rem}
section{background:#fff;border:1px solid #ddd;border-radius:.5rem;padding:1rem;margin:1rem 0}
h2{font-size:1.1rem;margin:0 0 .5rem}
.figures{font-size:1.25rem;font-variant-numeric:tabular-nums}
.meta{color:#555;font-size:.9rem}
.bar{height:.6rem;background:#eee;border-radius:.3rem;overflow:hidden;margin:.4rem 0}
.bar span{display:block;height:100%;background:#2b7de9}
.bar span.over{background:#d9534f}
svg{width:100%;height:auto;max-height:13rem;display:block}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{text-align:left;padding:.3rem;border-bottom:1px solid #eee}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.standing{font-weight:600;margin:.2rem 0}
.standing.ok{color:#2a7a2a}.standing.over{color:#b35c00}.standing.blocked{color:#c0392b}
svg text.axis{font-size:9px;fill:#555}
"""


def _when(moment: datetime | None) -> str:
    return "—" if moment is None else f"{clock_text(moment)} UTC"


def _day(at_us: int) -> str:
    moment = from_us(at_us)
    return f"{moment:%b} {moment.day}"


def _span(point: Point, per: str) -> str:
    """A bar's dates: its day, or its window's first and last day."""
    if per == "day":
        return _day(point.start_us)
    last_us = max(point.start_us, point.end_us - 1)
    return f"{_day(point.start_us)}\N{EN DASH}{_day(last_us)}"


def _chart(points: list[Point], with_maximum: bool, per: str) -> str:
    """Bars of usage per day (or per window), the maximum in force as a dashed
    line (``with_maximum``), the value axis (0, the top) and the bars' dates, as SVG."""
    width, height = 320, 140
    left, right, top_pad, bottom = 34, 4, 6, 18
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    maximums = [p.maximum or 0 for p in points] if with_maximum else []
    top = max([p.used for p in points] + maximums + [1])
    step = min(plot_w / max(len(points), 1), 40.0)  # a few windows: narrow bars
    base = top_pad + plot_h
    parts = [
        f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#999"/>',
        f'<text class="axis" x="{left - 3}" y="{base}" text-anchor="end">0</text>',
        f'<text class="axis top" x="{left - 3}" y="{top_pad + 7}" text-anchor="end">'
        f"{_short(top)}</text>",
    ]
    line = []
    for i, p in enumerate(points):
        x = left + i * step
        h = plot_h * p.used / top
        label = _span(p, per)
        parts.append(
            f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{max(step - 1, 1):.1f}" '
            f'height="{h:.1f}" fill="#2b7de9" data-start="{from_us(p.start_us).date()}" '
            f'data-used="{p.used}"><title>{label}: {p.used:,}</title></rect>'
        )
        if with_maximum and p.maximum is not None:
            y = base - plot_h * p.maximum / top
            line.append(f"{x:.1f},{y:.1f} {x + step:.1f},{y:.1f}")
    # Dates under the first, middle and last bars (every bar when there are few).
    shown = range(len(points)) if len(points) <= 6 else {0, len(points) // 2, len(points) - 1}
    for i in sorted(shown):
        x = left + (i + 0.5) * step
        anchor = "start" if i == 0 and len(points) > 6 else "middle"
        if i == len(points) - 1 and len(points) > 6:
            anchor = "end"
            x = left + (i + 1) * step
        elif anchor == "start":
            x = left + i * step
        parts.append(
            f'<text class="axis date" x="{x:.1f}" y="{height - 5}" text-anchor="{anchor}">'
            f"{_day(points[i].start_us)}</text>"
        )
    if line:
        parts.append(
            f'<polyline points="{" ".join(line)}" fill="none" stroke="#d9534f" '
            'stroke-dasharray="4 2" stroke-width="1"/>'
        )
    what = "day" if per == "day" else "window"
    return (
        f'<svg viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="usage per {what}, {len(points)} {what}s">' + "".join(parts) + "</svg>"
    )


def _short(value: int) -> str:
    """An axis value in few characters: 950, 1k, 12k, 3.4M."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= size:
            shown = value / size
            figure = f"{shown:.1f}".removesuffix(".0") if shown < 10 else f"{shown:.0f}"
            return figure + suffix
    return str(value)


def _standing(panel: LimitPanel) -> tuple[str, str]:
    """What the figures mean, in words, and the class that colours them."""
    if panel.maximum is None:
        return "", "ok"
    if panel.retry_at is not None and panel.enforcement == "hard":
        return f"limit reached: blocked until {_when(panel.retry_at)}", "blocked"
    if panel.used > panel.maximum:
        over = panel.used - panel.maximum
        if panel.enforcement == "soft":
            return f"over by {over:,}: billed as overage", "over"
        return f"over by {over:,}", "over"
    if panel.used == panel.maximum:
        return "limit reached", "over"
    return f"within the limit: {panel.maximum - panel.used:,} left", "ok"


def _panel(panel: LimitPanel) -> str:
    name = escape(panel.name)
    words, state = _standing(panel)
    if panel.maximum:
        share = min(panel.used / panel.maximum, 1.0)
        over = ' class="over"' if state != "ok" else ""
        bar = f'<div class="bar"><span{over} style="width:{share * 100:.1f}%"></span></div>'
        figures = f"{panel.used:,} of {panel.maximum:,}"
    else:
        bar = ""
        figures = f"{panel.used:,}"
    grants = (
        ""
        if panel.grants_left is None
        else f' · grants left <span class="grants">{panel.grants_left:,}</span>'
    )
    if not panel.days:
        chart = '<div class="meta">no history: a rate limit keeps no windows</div>'
    elif panel.per == "day":
        chart = _chart(panel.days, panel.daily, "day") + (
            f'<div class="meta">last {len(panel.days)} days, used per day (UTC)'
            f"{'; dashed: the maximum' if panel.daily else ''}</div>"
        )
    else:
        chart = _chart(panel.days, True, "window") + (
            '<div class="meta">used per window (this limit counts by window, not by day);'
            " dashed: the maximum</div>"
        )
    return (
        f'<section class="limit" data-limit="{name}" data-state="{state}">'
        f"<h2>{name}</h2>"
        f'<div class="figures" data-used="{panel.used}" data-maximum="{panel.maximum}">'
        f"{figures}</div>"
        f'<div class="standing {state}">{escape(words)}</div>{bar}'
        f'<div class="meta">resets {_when(panel.resets_at)}{_local(panel)}{grants}'
        f"{_exhausts(panel)}</div>"
        f"{chart}</section>"
    )


def _local(panel: LimitPanel) -> str:
    """The current window's local label, for a subject with a time zone."""
    if panel.time_zone is None or panel.local_window is None:
        return ""
    return (
        f' · <span class="local" data-time-zone="{escape(panel.time_zone)}">'
        f"this window: {escape(panel.local_window)}</span>"
    )


def _exhausts(panel: LimitPanel) -> str:
    if panel.exhausts_at is None:
        return ""
    return (
        f' · <span class="exhausts" data-exhausts-at="{panel.exhausts_at.isoformat()}">'
        f"runs out {_when(panel.exhausts_at)} at the recent rate</span>"
    )


def _denials(rows: list[WindowRow]) -> str:
    if not rows:
        return '<section id="denials"><h2>Denials</h2><p class="meta">none in 30 days</p></section>'
    body = "".join(
        f"<tr><td>{escape(r.limit)}</td><td>{_when(from_us(r.window_start_us))}</td>"
        f'<td class="n">{r.denied_count:,}</td><td class="n">{r.denied_cost:,}</td></tr>'
        for r in rows
    )
    return (
        '<section id="denials"><h2>Denials</h2><table><thead><tr><th>limit</th>'
        '<th>window</th><th class="n">events</th><th class="n">cost</th></tr></thead>'
        f"<tbody>{body}</tbody></table></section>"
    )


def _document(title: str, body: str) -> str:
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{title}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def render_page(view: PortalView) -> str:
    """The page, one self-contained HTML document."""
    subject = escape(view.subject)
    panels = "".join(_panel(p) for p in view.limits) or (
        '<section><p class="meta">no usage in 30 days</p></section>'
    )
    return _document(
        f"Usage of {subject}",
        f'<h1 id="subject">{subject}</h1><p class="meta">as of {_when(view.now)}</p>'
        f"{panels}{_denials(view.denials)}",
    )


def render_refusal(detail: str) -> str:
    """The page a browser gets for a link that does not open one (forged,
    expired) or no customer's key: what happened and what to do, nothing of
    any subject."""
    return _document(
        "Usage page unavailable",
        '<h1 id="refused">This link does not open a usage page</h1>'
        f'<section><p id="detail">{escape(detail)}</p>'
        '<p class="meta">Links work for a limited time. Ask whoever sent you this '
        "link for a new one.</p></section>",
    )
