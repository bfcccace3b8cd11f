"""The customer's usage page (`metering/usage/portal.py`) without HTTP, on
both databases: one panel per limit the subject used or holds grants of, the
maximum in force, grants only where there are some, a month-long window's
bars one per window; signed links open until they expire, forged ones never;
a rotated secret keeps old links for its grace; the page and the refusal are
self-contained HTML. (The routes: tests/api/test_portal.py.)"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput
from metering.storage import connections
from metering.storage.history import portal_secrets
from metering.usage.portal import (
    make_link,
    parse_grace,
    portal_view,
    render_page,
    render_refusal,
    rotate_link_secret,
    subject_of_link,
    validate_grace,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=100, period="1d", window="calendar"),
                Limit("monthly", maximum=1000, period="1mo", window="calendar"),
                Limit("soft", maximum=5, period="1h", window="calendar", enforcement="soft"),
                Limit("unused", maximum=9, period="1h"),
            ]
        )
        yield meter


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def test_a_panel_per_limit_used_with_the_maximum_in_force(meter: Meter) -> None:
    meter.set_entitlement("org", "calls", 200, effective_from=NOW - timedelta(days=1))
    meter.consume("org", "calls", 30)
    meter.consume("org", "monthly", 300)
    meter.consume("org", "soft", 7)
    meter.grant("org", "soft", 4)
    view = portal_view(meter.database, "org")
    assert (view.subject, view.now) == ("org", NOW)
    panels = {p.name: p for p in view.limits}
    assert sorted(panels) == ["calls", "monthly", "soft"]  # "unused": never used, no grant
    calls, monthly, soft = panels["calls"], panels["monthly"], panels["soft"]
    assert (calls.used, calls.maximum, calls.grants_left, calls.per) == (30, 200, None, "day")
    assert calls.days[-1].used == 30 and len(calls.days) == 30
    assert (monthly.per, [p.used for p in monthly.days]) == ("window", [300])
    assert (soft.used, soft.overage, soft.grants_left) == (7, 2, 4)
    with pytest.raises(InvalidInput):
        portal_view(meter.database, " org")


def test_a_past_windows_bar_keeps_the_maximum_at_its_end(meter: Meter, clock: FrozenClock) -> None:
    meter.consume("org", "monthly", 300)  # November
    clock.set(NOW + timedelta(days=15))  # December 7
    meter.set_limit(Limit("monthly", maximum=2000, period="1mo", window="calendar"))
    meter.consume("org", "monthly", 100)
    [monthly] = [p for p in portal_view(meter.database, "org").limits if p.name == "monthly"]
    assert monthly.maximum == 2000
    assert [(p.used, p.maximum) for p in monthly.days] == [(300, 1000), (100, 2000)]


def test_the_page_is_one_self_contained_document(meter: Meter) -> None:
    meter.consume("org", "calls", 30)
    meter.consume("<b>org</b>", "calls", 1)
    page = render_page(portal_view(meter.database, "org"))
    assert page.lower().startswith("<!doctype html>")
    assert "<script" not in page and "http" not in page.split("<body", 1)[1]
    assert 'name="viewport"' in page and "calls" in page and "<svg" in page
    escaped = render_page(portal_view(meter.database, "<b>org</b>"))
    assert "<b>org</b>" not in escaped and "&lt;b&gt;org&lt;/b&gt;" in escaped
    refusal = render_refusal("this link has expired")
    assert "this link has expired" in refusal and "<script" not in refusal


def test_a_link_opens_its_subject_until_it_expires(meter: Meter, clock: FrozenClock) -> None:
    link = make_link(meter.database, "org", 3600, base_url="https://usage.example/")
    assert link.startswith("https://usage.example/portal?token=")
    token = token_of(link)
    assert subject_of_link(meter.database, token) == "org"
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert subject_of_link(meter.database, forged) is None
    assert subject_of_link(meter.database, "not a token") is None
    clock.advance(seconds=3601)
    assert subject_of_link(meter.database, token) is None
    with pytest.raises(InvalidInput):
        make_link(meter.database, "org", 0)


def test_a_rotated_secret_keeps_old_links_for_its_grace(meter: Meter, clock: FrozenClock) -> None:
    old = token_of(make_link(meter.database, "org", 86_400))
    assert rotate_link_secret(meter.database, 600) == NOW + timedelta(seconds=600)
    new = token_of(make_link(meter.database, "org", 86_400))
    assert subject_of_link(meter.database, old) == subject_of_link(meter.database, new) == "org"
    clock.advance(seconds=601)
    assert subject_of_link(meter.database, old) is None
    assert subject_of_link(meter.database, new) == "org"
    rotate_link_secret(meter.database, 0)
    assert subject_of_link(meter.database, new) is None  # no grace: at once


def test_a_grace_is_0_to_31_days() -> None:
    assert (parse_grace("0"), parse_grace("30m"), parse_grace("7d")) == (0, 1800, 604_800)
    assert validate_grace(31 * 86_400) == 31 * 86_400
    for bad in (-1, 31 * 86_400 + 1, True, 1.5):
        with pytest.raises(InvalidInput):
            validate_grace(bad)
    for text in ("32d", "soon", ""):
        with pytest.raises(InvalidInput):
            parse_grace(text)


def test_checking_a_link_writes_nothing_and_takes_no_write_lock(
    tmp_path: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link is checked on a read: on a database where no link was ever made
    no secret is made for it, and on SQLite a writer holding the write lock
    does not stop the page (the check would wait out the busy timeout)."""
    monkeypatch.setattr(connections, "SQLITE_BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "links.db"
    with Meter(f"sqlite:///{path}", clock=clock) as meter:
        assert subject_of_link(meter.database, "org.4102444800.AAAA") is None
        assert meter.database.read(lambda c: portal_secrets(c, meter.database.now_us())) == []
        token = token_of(make_link(meter.database, "org", 3600))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert subject_of_link(meter.database, token) == "org"
        finally:
            holder.rollback()
            holder.close()
