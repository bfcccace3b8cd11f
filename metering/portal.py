"""The usage page a customer opens: ``GET /portal`` (docs/portal.md).

`portal_view` gathers one subject's figures (read-only but for recurring
grants falling due, as every listing of grants does); `render_page` turns
them into one self-contained HTML page: no script, inline CSS and SVG, a
viewport for phones. `make_link` and `subject_of_link` sign and check the
short-lived links ``metering portal link SUBJECT --ttl 1h`` prints, under a
secret kept in the database (`metering.storage.history.portal_secret`);
`rotate_link_secret` replaces it, the old one still opening the links it
signed until a grace ends (``metering portal rotate --grace 1d``).

Per limit: used against the maximum in force in the current window, when it
resets, the grants left, and the last 30 days by day (`metering.history`);
then the recent denials: the subject's windows of those 30 days with denied
events, from the counters (each window's denied events and cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from typing import Final
from urllib.parse import quote

from metering.allowances.service import grants_left, list_grants
from metering.domain.events import validate_subject
from metering.domain.history import Point, maximum_at
from metering.domain.instants import from_us
from metering.domain.links import MAX_TTL_SECONDS, parse_ttl, sign, validate_ttl, verify
from metering.errors import InvalidInput
from metering.history import usage_history
from metering.lookup import subject_usage
from metering.storage.database import Database
from metering.storage.history import (
    WindowRow,
    counter_windows,
    entitlement_changes,
    portal_secret,
    portal_secrets,
    rotate_secret,
)

DAYS: Final = 30
MAX_DENIALS: Final = 20


@dataclass(frozen=True, slots=True)
class LimitPanel:
    name: str
    used: int
    maximum: int | None
    resets_at: datetime | None
    grants_left: int
    days: list[Point]
    # The chart draws the maximum only over days it bounds: a daily limit's.
    daily: bool = False


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
    windows = database.run(lambda c: counter_windows(c, subject, None, since_us, now_us + 1))
    grants = [g for g in list_grants(database, subject) if g.left > 0]
    names = sorted(set(current) | {w.limit for w in windows} | {g.limit for g in grants})
    now = from_us(now_us)
    left = grants_left(grants, now)
    changes = database.run(lambda c: {n: entitlement_changes(c, subject, n) for n in names})
    panels = []
    for name in names:
        history = usage_history(
            database, subject, name, since=now - timedelta(days=days - 1), until=now, bucket="day"
        )
        limit = history.limit
        default = None if limit.algorithm == "token_bucket" else limit.maximum
        found = current.get(name)
        panels.append(
            LimitPanel(
                name=name,
                used=found.used if found is not None else 0,
                maximum=maximum_at(changes[name], default, now_us),
                resets_at=found.resets_at if found is not None else None,
                grants_left=left.get(name, 0),
                days=history.points,
                daily=limit.period in ("1d", "24h"),
            )
        )
    denials = [w for w in reversed(windows) if w.denied_count > 0][:MAX_DENIALS]
    return PortalView(subject, now, panels, denials)


# -- links ---------------------------------------------------------------------


def make_link(
    database: Database, subject: str, ttl_seconds: int, base_url: str = "http://127.0.0.1:8000"
) -> str:
    """A link to ``subject``'s page that works for ``ttl_seconds``."""
    validate_subject(subject)
    ttl = validate_ttl(ttl_seconds)
    now_us = database.now_us()
    secret = database.run(lambda c: portal_secret(c, now_us))
    token = sign(secret, subject, now_us // 1_000_000 + ttl)
    return f"{base_url.rstrip('/')}/portal?token={quote(token)}"


def subject_of_link(database: Database, token: str) -> str | None:
    """The subject a link's token is for, or None (forged, expired, malformed):
    signed with the secret in use, or with the one a rotation replaced while
    its grace lasts."""
    now_us = database.now_us()
    keys = database.run(lambda c: portal_secrets(c, now_us))
    found = (verify(secret, token, now_us // 1_000_000) for secret in keys)
    return next((subject for subject in found if subject is not None), None)


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
svg{width:100%;height:auto;display:block}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{text-align:left;padding:.3rem;border-bottom:1px solid #eee}
td.n{text-align:right;font-variant-numeric:tabular-nums}
"""


def _when(moment: datetime | None) -> str:
    return "—" if moment is None else moment.strftime("%Y-%m-%d %H:%M UTC")


def _chart(points: list[Point], with_maximum: bool) -> str:
    """Bars of usage per day and (``with_maximum``) the maximum in force as a line, as SVG."""
    width, height, pad = 300, 100, 2
    maximums = [p.maximum or 0 for p in points] if with_maximum else []
    top = max([p.used for p in points] + maximums + [1])
    step = (width - 2 * pad) / max(len(points), 1)
    bars = []
    line = []
    for i, p in enumerate(points):
        x = pad + i * step
        h = (height - 2 * pad) * p.used / top
        day = from_us(p.start_us).strftime("%Y-%m-%d")
        bars.append(
            f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{max(step - 1, 1):.1f}" '
            f'height="{h:.1f}" fill="#2b7de9"><title>{day}: {p.used}</title></rect>'
        )
        if with_maximum and p.maximum is not None:
            y = height - pad - (height - 2 * pad) * p.maximum / top
            line.append(f"{x:.1f},{y:.1f} {x + step:.1f},{y:.1f}")
    limit_line = (
        f'<polyline points="{" ".join(line)}" fill="none" stroke="#d9534f" '
        'stroke-dasharray="4 2" stroke-width="1"/>'
        if line
        else ""
    )
    return (
        f'<svg viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="usage per day, last {len(points)} days">'
        + "".join(bars)
        + limit_line
        + "</svg>"
    )


def _panel(panel: LimitPanel) -> str:
    name = escape(panel.name)
    if panel.maximum:
        share = min(panel.used / panel.maximum, 1.0)
        over = ' class="over"' if panel.used >= panel.maximum else ""
        bar = f'<div class="bar"><span{over} style="width:{share * 100:.1f}%"></span></div>'
        figures = f"{panel.used:,} of {panel.maximum:,}"
    else:
        bar = ""
        figures = f"{panel.used:,}"
    return (
        f'<section class="limit" data-limit="{name}">'
        f"<h2>{name}</h2>"
        f'<div class="figures" data-used="{panel.used}" data-maximum="{panel.maximum}">'
        f"{figures}</div>{bar}"
        f'<div class="meta">resets {_when(panel.resets_at)} · '
        f'grants left <span class="grants">{panel.grants_left:,}</span></div>'
        f"{_chart(panel.days, panel.daily)}"
        f'<div class="meta">last {len(panel.days)} days, used per day'
        f"{'; dashed: the maximum' if panel.daily else ''}</div></section>"
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


def render_page(view: PortalView) -> str:
    """The page, one self-contained HTML document."""
    subject = escape(view.subject)
    panels = "".join(_panel(p) for p in view.limits) or (
        '<section><p class="meta">no usage in 30 days</p></section>'
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>Usage of {subject}</title><style>{CSS}</style></head>"
        f'<body><main><h1 id="subject">{subject}</h1>'
        f'<p class="meta">as of {_when(view.now)}</p>'
        f"{panels}{_denials(view.denials)}</main></body></html>\n"
    )
