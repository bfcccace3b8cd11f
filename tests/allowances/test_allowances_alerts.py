"""Per-subject alert thresholds (`metering/allowances/alerts.py`) on both
databases: set (percents and units, replacing what the subject had), listed
by subject and limit, removed back to the limit's; an unknown limit or a bad
point is refused and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.allowances.alerts import ALERT_KEYS
from metering.errors import InvalidInput, UnknownLimit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=100, period="1h", window="calendar"))
        meter.set_limit(Limit("tokens", maximum=1000, period="1d", window="calendar"))
        yield meter


def test_an_alert_is_set_replaced_listed_and_removed(meter: Meter) -> None:
    made = meter.set_alert("org", "calls", ["80%", 50, "50%"])
    assert (made.thresholds, made.thresholds_units, made.updated_at) == ((50, 80), (50,), NOW)
    assert made.at == ["50%", "80%", "50"]
    assert list(made.to_dict()) == list(ALERT_KEYS)
    meter.set_alert("org", "calls", ["90%"])
    meter.set_alert("org", "tokens", [500])
    meter.set_alert("other", "calls", ["10%"])
    assert [(a.subject, a.limit, a.at) for a in meter.alerts(subject="org")] == [
        ("org", "calls", ["90%"]),
        ("org", "tokens", ["500"]),
    ]
    assert [a.subject for a in meter.alerts(limit="calls")] == ["org", "other"]
    assert meter.remove_alert("org", "calls") is True
    assert meter.remove_alert("org", "calls") is False  # back to the limit's already
    assert [a.limit for a in meter.alerts(subject="org")] == ["tokens"]


def test_a_bad_alert_is_refused_and_stores_nothing(meter: Meter) -> None:
    with pytest.raises(UnknownLimit):
        meter.set_alert("org", "nope", ["80%"])
    for bad in (["eighty"], ["0%"], [], [-5]):
        with pytest.raises(InvalidInput):
            meter.set_alert("org", "calls", bad)
    with pytest.raises(InvalidInput):
        meter.set_alert(" org", "calls", ["80%"])
    with pytest.raises(InvalidInput):
        meter.alerts(subject="")
    assert meter.alerts() == []


def test_removing_an_alert_of_an_unknown_limit_is_refused(meter: Meter) -> None:
    with pytest.raises(UnknownLimit):
        meter.remove_alert("org", "nope")


def test_an_alert_outliving_its_limit_can_still_be_removed(meter: Meter) -> None:
    meter.set_alert("org", "tokens", [500])
    meter.delete_limit("tokens")
    assert meter.remove_alert("org", "tokens") is True
    with pytest.raises(UnknownLimit):
        meter.remove_alert("org", "tokens")
