"""The decayed rate and the exhaustion forecast, against rates computed by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from metering.domain.forecast import (
    FORGET_TAUS,
    TAU_SECONDS,
    TAU_US,
    TINY_RATE,
    added,
    allowance,
    decayed,
    exhausts_at_us,
    forecast_notice,
    with_exhausts_at,
)
from metering.domain.notifications import Notice, payload_of
from metering.domain.state import CounterKey

HOUR_US = 3_600_000_000


def test_a_charge_adds_its_cost_over_tau_and_decays_by_e_every_tau() -> None:
    rate, at = added(0.0, 0, 360, 10 * HOUR_US)
    assert (rate, at) == (360 / TAU_SECONDS, 10 * HOUR_US)
    assert decayed(rate, at, at + TAU_US) == pytest.approx(0.1 / math.e, rel=1e-12)
    rate, at = added(rate, at, 36, at + TAU_US // 2)
    assert rate == pytest.approx(0.1 * math.exp(-0.5) + 0.01, rel=1e-12)


def test_a_steady_stream_converges_to_its_rate() -> None:
    rate, at = 0.0, 0
    for minute in range(1, 24 * 60):  # 120 units a minute: 2 a second
        rate, at = added(rate, at, 120, minute * 60_000_000)
    assert rate == pytest.approx(2 * (60 / TAU_SECONDS) / (1 - math.exp(-60 / TAU_SECONDS)))
    assert rate == pytest.approx(2.0, rel=0.01)


def test_give_backs_and_earlier_instants_neither_add_nor_decay() -> None:
    assert added(0.5, HOUR_US, -10, 2 * HOUR_US)[0] == pytest.approx(0.5 / math.e)
    assert added(0.5, HOUR_US, 0, HOUR_US // 2) == (0.5, HOUR_US)


def test_a_long_silence_or_a_tiny_rate_reads_zero() -> None:
    assert decayed(1e9, 0, 51 * TAU_US) == 0.0
    assert decayed(1e-101, 0, 1) == 0.0
    assert decayed(1.0, 0, 49 * TAU_US) == pytest.approx(math.exp(-49))


def test_a_rate_is_forgotten_only_past_fifty_taus() -> None:
    assert decayed(2.0, TAU_US, (FORGET_TAUS + 1) * TAU_US) == 2.0 * math.exp(-FORGET_TAUS)
    assert decayed(2.0, TAU_US, (FORGET_TAUS + 1) * TAU_US + 1) == 0.0


def test_exhaustion_at_the_rate_held_constant() -> None:
    # 400 units left at 0.1 a second: 4,000 seconds from now.
    assert exhausts_at_us(600, 1_000, 0.1, 0, 2 * HOUR_US) == 4_000_000_000
    assert exhausts_at_us(600, 1_000, 0.1, 0, 4_000_000_000) is None  # at the reset: not before
    assert exhausts_at_us(600, 1_000, 0.0, 0, 2 * HOUR_US) is None
    assert exhausts_at_us(1_000, 1_000, 0.0, 7, 2 * HOUR_US) == 7  # spent: now
    assert exhausts_at_us(1, 2, 3.0, 0, HOUR_US) == 333_334  # rounded up


KEY = CounterKey("calls", "org-1", 0, 24 * HOUR_US)


def test_a_forecast_notice_within_the_lead_only() -> None:
    counter = (720, 0.2, HOUR_US)  # 280 of 1,000 left at 0.2 a second: 1,400 s
    notice = forecast_notice(KEY, 1_000, 1_400, counter, HOUR_US, "ev-1")
    assert notice is not None
    assert (notice.type, notice.mark, notice.exhausts_at_us) == (
        "limit.forecast",
        "forecast",
        HOUR_US + 1_400_000_000,
    )
    assert payload_of(notice, HOUR_US)["data"]["exhausts_at"] == "1970-01-01T01:23:20Z"
    assert forecast_notice(KEY, 1_000, 1_399, counter, HOUR_US, "ev-1") is None
    assert forecast_notice(KEY, 1_000, 9_999, (720, 0.0, 0), HOUR_US, None) is None


def test_a_threshold_is_told_its_forecast() -> None:
    notice = forecast_notice(KEY, 1_000, 1, (1_000, 0.0, 0), 5, None)
    assert notice is not None and notice.exhausts_at_us == 5  # spent: now
    told = with_exhausts_at(replace(notice, exhausts_at_us=None), (720, 0.2, 0), 0)
    assert told.exhausts_at_us == 1_400_000_000


T = 1_800_000_000_000_000  # an instant of 2027


def test_the_allowance_is_the_maximum_or_the_usage_past_it_plus_the_grants() -> None:
    assert allowance(5, 10, 3) == 13
    assert allowance(12, 10, 3) == 15


def test_a_rate_decays_from_its_own_instant() -> None:
    assert decayed(1.0, T, T + TAU_US) == pytest.approx(math.exp(-1))
    assert decayed(1.0, T, T + FORGET_TAUS * TAU_US) == pytest.approx(math.exp(-FORGET_TAUS))
    assert decayed(1.0, T, T + FORGET_TAUS * TAU_US + 1) == 0.0
    assert decayed(TINY_RATE, T, T) == TINY_RATE


def test_exhaustion_just_before_the_windows_end() -> None:
    assert exhausts_at_us(0, 10, 1.0, T, T + 10_000_001) == T + 10_000_000
    assert exhausts_at_us(0, 10, 1.0, T, T + 10_000_000) is None


def test_a_forecast_notice_is_whole_and_only_within_its_lead() -> None:
    key = CounterKey("calls", "org", T, T + 10**10)
    # 1 unit left at 1 per 4.000002 s: out 4.000003 s from now, past a lead of 4 s
    assert forecast_notice(key, 1, 4, (0, 1 / 4.000002, T), T, "e") is None
    found = forecast_notice(key, 10, 60, (4, 1.0, T), T, "e")
    assert found == Notice(
        type="limit.forecast",
        mark="forecast",
        limit="calls",
        subject="org",
        maximum=10,
        used=4,
        window_start_us=T,
        window_end_us=T + 10**10,
        resets_at_us=T + 10**10,
        retry_at_us=None,
        event_id="e",
        exhausts_at_us=T + 6_000_000,
    )
