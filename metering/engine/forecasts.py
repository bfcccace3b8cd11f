"""Forecast notices, found after a batch's counters are written, in its
transaction: ``limit.forecast`` for the charges of limits with a forecast
lead, and the forecast told to ``limit.threshold`` notices
(`metering.domain.forecast`), counting the grants in force as the usage
answers do. One read of the counters concerned and one of their grants, and
none when the batch has neither.

The charges come as ledger rows (`ChargeDecision.to_row` order), which both
the fast path (its records) and the reference engine (its decisions) have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import Connection

from metering.domain.decisions import CHARGE_KEYS
from metering.domain.forecast import forecast_notice, with_exhausts_at
from metering.domain.limits import Limit
from metering.domain.notifications import Notice
from metering.domain.state import CounterKey
from metering.storage.allowances import AllowanceStore
from metering.storage.counters import CounterStore

_SUBJECT, _LIMIT, _MAXIMUM, _START, _END = (
    CHARGE_KEYS.index(name) for name in ("subject", "limit", "maximum", "window_start", "resets_at")
)
ChargeRows = Iterable[tuple[str | None, Sequence[Sequence[Any]]]]  # (event id, its charge rows)
_TOLD: Final = ("limit.threshold",)


def leads_of(limits: Iterable[Limit]) -> dict[str, int]:
    """The forecast leads in seconds of those of ``limits`` that have one, by name."""
    return {
        limit.name: limit.forecast_lead_seconds for limit in limits if limit.forecast_lead_seconds
    }


def with_forecasts(
    connection: Connection,
    leads: Mapping[str, int],
    charges: ChargeRows,
    notices: Sequence[Notice],
    now_us: int,
) -> list[Notice]:
    """``notices``, thresholds told their forecast, then the ``limit.forecast``
    candidates of ``charges`` (the last charge of each counter)."""
    charged, keys = forecast_keys(leads, charges, notices)
    if not keys:
        return list(notices)
    counters = CounterStore(connection).read_rates(keys)
    left = AllowanceStore(connection).grants_left({(k.limit, k.subject) for k in keys}, now_us)
    return forecast_with(leads, charged, notices, now_us, counters, left)


def forecast_keys(
    leads: Mapping[str, int], charges: ChargeRows, notices: Sequence[Notice]
) -> tuple[dict[CounterKey, tuple[int, str | None]], list[CounterKey]]:
    """The counters `with_forecasts` reads: those ``charges`` charged of
    limits with a lead (with their maximum and the last event), then those
    of the thresholds in ``notices``."""
    charged: dict[CounterKey, tuple[int, str | None]] = {}
    if leads:
        for event_id, rows in charges:
            for row in rows:
                if row[_LIMIT] in leads:
                    key = CounterKey(row[_LIMIT], row[_SUBJECT], row[_START], row[_END])
                    charged[key] = (row[_MAXIMUM], event_id)
    told = [_key(n) for n in notices if n.type in _TOLD and not n.is_bucket]
    return charged, [*charged, *told]


def forecast_with(
    leads: Mapping[str, int],
    charged: Mapping[CounterKey, tuple[int, str | None]],
    notices: Sequence[Notice],
    now_us: int,
    counters: Mapping[CounterKey, tuple[int, float, int]],
    left: Mapping[tuple[str, str], int],
) -> list[Notice]:
    """`with_forecasts` on the counters (used, rate, rate instant) as
    written and the grants' ``left`` (by limit and subject) given."""
    found = [
        with_exhausts_at(n, counters[_key(n)], now_us, left.get((n.limit, n.subject), 0))
        if n.type in _TOLD and not n.is_bucket and _key(n) in counters
        else n
        for n in notices
    ]
    for key, (maximum, event_id) in charged.items():
        if key in counters:
            lead, grants = leads[key.limit], left.get((key.limit, key.subject), 0)
            notice = forecast_notice(key, maximum, lead, counters[key], now_us, event_id, grants)
            if notice is not None:
                found.append(notice)
    return found


def _key(notice: Notice) -> CounterKey:
    return CounterKey(notice.limit, notice.subject, notice.window_start_us, notice.window_end_us)
