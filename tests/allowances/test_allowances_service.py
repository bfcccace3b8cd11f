"""The transactions of entitlements, grants and corrections
(`metering/allowances/service.py`), on SQLite and PostgreSQL with a frozen
clock: an entitlement deleted goes back to the default and keeps its history;
a grant id given again is the same grant, with other figures a conflict; a
void counts once, only of an allowed event within the horizon; every bad
input is refused and changes nothing."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from metering import FrozenClock, Limit, Meter
from metering.allowances.service import grants_left
from metering.domain.instants import MICROSECOND
from metering.errors import (
    CorrectionConflict,
    CorrectionRefused,
    DatabaseUnavailable,
    GrantConflict,
    InvalidInput,
    UnknownEvent,
    UnknownLimit,
)
from metering.storage import connections

MONTH = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
CALLS = Limit("api_calls", maximum=250, period="1mo", window="calendar", lateness="7d")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(MONTH)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Meter:
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(CALLS)
        yield meter


def _used(meter: Meter, subject: str, limit: str = "api_calls") -> list[int]:
    return [counter.used for counter in meter.counters(subject, limit)]


def test_deleting_an_entitlement_returns_to_the_default_and_keeps_history(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.set_entitlement("org-7", "api_calls", 1000, effective_from=MONTH)
    assert meter.consume("org-7", "api_calls", 600).maximum == 1000
    clock.advance(days=2)
    meter.delete_entitlement("org-7", "api_calls")
    assert meter.check("org-7", "api_calls", 1).maximum == 250
    history = [(e.maximum, e.effective_from_us) for e in meter.entitlements("org-7")]
    assert [m for m, _ in history] == [1000, None]
    assert (
        meter.result(meter.consume("org-7", "api_calls", 1, event_id="x").event_id).maximum == 250
    )


def test_entitlements_refuse_bad_input_and_change_nothing(meter: Meter) -> None:
    with pytest.raises(UnknownLimit):
        meter.set_entitlement("org-7", "nope", 10)
    with pytest.raises(InvalidInput, match="maximum"):
        meter.set_entitlement("org-7", "api_calls", 0)
    with pytest.raises(InvalidInput, match="effective_from"):
        meter.set_entitlement("org-7", "api_calls", 5, effective_from=datetime(2026, 11, 1))
    with pytest.raises(InvalidInput, match="subject"):
        meter.set_entitlement(" org", "api_calls", 5)
    assert meter.entitlements() == []


def test_a_regrant_with_the_same_id_is_idempotent(meter: Meter) -> None:
    first = meter.grant("org-42", "api_calls", 100, MONTH + 9 * DAY, grant_id="goodwill-1")
    again = meter.grant("org-42", "api_calls", 100, MONTH + 9 * DAY, grant_id="goodwill-1")
    assert (first.duplicate, again.duplicate) == (False, True)
    with pytest.raises(GrantConflict):
        meter.grant("org-42", "api_calls", 999, MONTH + 9 * DAY, grant_id="goodwill-1")
    assert [(g.grant_id, g.amount) for g in meter.grants()] == [("goodwill-1", 100)]
    assert meter.consume("org-42", "api_calls", 350).allowed
    assert not meter.consume("org-42", "api_calls", 1).allowed


def test_grants_refuse_bad_input_and_change_nothing(meter: Meter) -> None:
    meter.set_limit(Limit("burst", maximum=2, period="10s", algorithm="token_bucket"))
    with pytest.raises(InvalidInput, match="token bucket"):
        meter.grant("org", "burst", 5)
    with pytest.raises(InvalidInput, match="amount"):
        meter.grant("org", "api_calls", 0)
    with pytest.raises(InvalidInput, match="expires_at"):
        meter.grant("org", "api_calls", 5, MONTH - DAY)
    with pytest.raises(InvalidInput, match="grant_id"):
        meter.grant("org", "api_calls", 5, grant_id="no spaces")
    with pytest.raises(UnknownLimit):
        meter.grant("org", "nope", 5)
    assert meter.grants() == []


def test_a_double_void_counts_once(meter: Meter) -> None:
    meter.consume("org-42", "api_calls", 40, event_id="e")
    meter.consume("org-42", "api_calls", 5)
    first = meter.void("e", "duplicate", correction_id="c-1")
    again = meter.void("e", "duplicate", correction_id="c-2")
    same = meter.void("e", "duplicate", correction_id="c-1")
    assert (first.duplicate, again.duplicate, same.duplicate) == (False, True, True)
    assert again.correction_id == "c-1"
    assert _used(meter, "org-42") == [5]
    meter.consume("org-42", "api_calls", 1, event_id="other")
    with pytest.raises(CorrectionConflict):
        meter.void("other", "x", correction_id="c-1")
    assert len(meter.corrections()) == 1


def test_only_allowed_events_within_the_horizon_can_be_voided(
    meter: Meter, clock: FrozenClock
) -> None:
    meter.consume("org-42", "api_calls", 250)
    denied = meter.consume("org-42", "api_calls", 1, event_id="denied")
    assert not denied.allowed
    with pytest.raises(CorrectionRefused, match="denied"):
        meter.void("denied", "x")
    with pytest.raises(UnknownEvent):
        meter.void("never-seen", "x")
    with pytest.raises(InvalidInput, match="reason"):
        meter.void("denied", "  ")
    meter.consume("org-7", "api_calls", 1, event_id="late-void", occurred_at=MONTH)
    clock.set(MONTH + 35 * DAY + MICROSECOND)
    with pytest.raises(CorrectionRefused, match="35-day horizon"):
        meter.void("late-void", "too late")
    assert meter.void("late-void", "ok", horizon_seconds=40 * 86_400).duplicate is False
    assert len(meter.corrections()) == 1


def test_entitlements_are_set_from_a_file_all_or_none(meter: Meter, tmp_path: Path) -> None:
    path = tmp_path / "entitlements.yaml"
    path.write_text(
        "- {subject: org-1, limit: api_calls, maximum: 500}\n"
        "- {subject: org-2, limit: api_calls, maximum: 900, effective_from: 2026-11-10}\n"
    )
    loaded = meter.load_entitlements(path)
    assert [(e.subject, e.maximum) for e in loaded] == [("org-1", 500), ("org-2", 900)]
    assert [e.subject for e in meter.entitlements(limit="api_calls")] == ["org-1", "org-2"]
    path.write_text(
        "- {subject: org-3, limit: api_calls, maximum: 5}\n"
        "- {subject: org-4, limit: nope, maximum: 5}\n"
    )
    with pytest.raises(InvalidInput, match="entry 2"):
        meter.load_entitlements(path)
    assert [e.subject for e in meter.entitlements()] == ["org-1", "org-2"]


def test_grants_are_listed_with_what_is_left(meter: Meter) -> None:
    meter.grant("org-42", "api_calls", 100, grant_id="g-1", reason="goodwill")
    meter.grant("org-7", "api_calls", 10, grant_id="g-2")
    meter.consume("org-42", "api_calls", 260)  # 10 past the maximum: drawn on g-1
    [granted] = meter.grants(subject="org-42")
    assert (granted.grant_id, granted.used, granted.left, granted.reason) == (
        "g-1",
        10,
        90,
        "goodwill",
    )
    assert grants_left(meter.grants(), MONTH) == {"api_calls": 100}
    assert [g.grant_id for g in meter.grants(limit="api_calls")] == ["g-1", "g-2"]


def test_grants_are_listed_on_a_read_while_no_recurring_issue_is_due(
    tmp_path: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing grants makes the recurring issues due first; while none is
    due it only reads: on SQLite a writer holding the write lock does not
    stop it. Once one is due, the listing makes it (and then waits its turn)."""
    monkeypatch.setattr(connections, "SQLITE_BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "grants.db"
    with Meter(f"sqlite:///{path}", clock=clock) as meter:
        meter.set_limit(CALLS)
        meter.grant("org", "api_calls", 50, every="1d", grant_id="daily")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert [g.amount for g in meter.grants("org")] == [50]
            assert len(meter.recurring_grants("org")) == 1
            clock.advance(days=1)
            with pytest.raises(DatabaseUnavailable):
                meter.grants("org")
        finally:
            holder.rollback()
            holder.close()
        assert [g.amount for g in meter.grants("org")] == [50, 50]
