"""``limit.forecast`` goes out once per window when the forecast exhaustion
falls within the limit's lead, and ``limit.threshold`` tells the forecast:
on every path (a forecast lead takes the events to a path that writes
notices) and both databases, at frozen instants, against the rate computed
by hand (docs/forecasts.md)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.storage.tables import webhook_messages

NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LIMIT = Limit(
    "calls", maximum=1_000, period="1d", window="calendar", thresholds=(50,), forecast_lead="1h"
)
PATHS = {
    "one_trip": ("one_trip", "direct", "connection", "reference"),
    "direct": ("direct", "connection", "reference"),
    "connection": ("connection", "reference"),
    "reference": ("reference",),
}


def _messages(meter: Meter) -> list[tuple[str, dict[str, object]]]:
    query = select(webhook_messages.c.type, webhook_messages.c.payload).order_by(
        webhook_messages.c.created_at_us, webhook_messages.c.type
    )
    with meter.sql_engine.connect() as connection:
        return [(t, json.loads(p)["data"]) for t, p in connection.execute(query)]


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize("path", list(PATHS))
def test_a_forecast_within_the_lead_is_told_once_per_window(db_url: str, path: str) -> None:
    if path == "one_trip" and not db_url.startswith("postgresql"):
        pytest.skip("the one-trip function is PostgreSQL's")
    clock = FrozenClock(NOON)
    with Meter(db_url, clock=clock) as meter:
        engine = meter._engine
        engine.paths = [engine.path(name) for name in PATHS[path]]
        meter.set_limit(LIMIT)
        meter.consume("org-1", "calls", 360)  # 0.1 a second: 640 left in 6,400 s, past the lead
        assert _messages(meter) == []
        clock.advance(seconds=60)
        meter.consume("org-1", "calls", 360)  # crosses 50 %; 280 left
        rate = 0.1 * math.exp(-60 / 3600) + 0.1
        expected = clock() + timedelta(microseconds=math.ceil(280 / rate * 1_000_000))
        found = _messages(meter)
        assert [t for t, _ in found] == ["limit.forecast", "limit.threshold"]
        assert {data["exhausts_at"] for _, data in found} == {_iso(expected)}
        forecast = found[0][1]
        assert (forecast["used"], forecast["maximum"]) == (720, 1_000)
        assert forecast["resets_at"] == _iso(datetime(2026, 12, 1, tzinfo=UTC))
        clock.advance(seconds=60)
        meter.consume("org-1", "calls", 100)
        assert len(_messages(meter)) == 2  # once per window
        clock.set(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
        meter.consume("org-1", "calls", 1_000)  # spent at once: runs out now
        found = _messages(meter)
        assert [t for t, _ in found][2:] == ["limit.forecast", "limit.threshold"]
        assert found[2][1]["exhausts_at"] == _iso(clock())


def test_no_lead_no_forecast(db_url: str) -> None:
    with Meter(db_url, clock=FrozenClock(NOON)) as meter:
        meter.set_limit(Limit("calls", maximum=1_000, period="1d", window="calendar"))
        meter.consume("org-1", "calls", 1_000)
        assert _messages(meter) == []
