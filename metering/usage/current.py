"""A subject's usage now: `subject_usage` gives, for every limit the subject used
or was denied in its current window (a token bucket: ever), what a charge of 1 would
meet now (`LimitUsage`: used, remaining, the subject's maximum, resets_at, retry_at
when it would be denied), ``grants_left``, what its grants in force add, counted as
the usage page counts them (`metering.allowances.service.grants_left`; a limit with
grants left is listed before its first use), and ``exhausts_at``, when both run out
at the counter's recent rate (`metering.domain.forecast`); a calendar window of a subject
with a time zone also carries ``time_zone`` and ``local_window``, its zone and local label
(`metering.domain.zones.window_label`), as counters and reports do. It decides with the
pure domain (`evaluate_charge`) and writes nothing but recurring grants falling due.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from metering.allowances.service import grants_left, list_grants
from metering.domain.decisions import ChargeInput, evaluate_charge
from metering.domain.events import validate_subject
from metering.domain.forecast import allowance, decayed, exhausts_at_us
from metering.domain.grants import maximum_at
from metering.domain.instants import from_us, to_us
from metering.domain.limits import Limit
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.zones import ZoneHistory, window_label
from metering.engine.reference import WindowResolver
from metering.storage.allowances import AllowanceStore
from metering.storage.database import Database
from metering.storage.store import Store


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One limit of a subject, now: the figures a charge of 1 would meet."""

    limit: Limit
    used: int
    remaining: int
    overage: int
    window_start: datetime | None
    resets_at: datetime
    retry_at: datetime | None
    grants_left: int = 0
    # When what is left (remaining and grants) runs out at the recent rate,
    # if before the reset (`metering.domain.forecast`); None for a bucket.
    exhausts_at: datetime | None = None
    # A calendar window aligned at the subject's local midnight: its zone and local label.
    time_zone: str | None = None
    local_window: str | None = None


def usage_dict(usage: LimitUsage) -> dict[str, Any]:
    """One limit's usage as JSON (the API's ``LimitUsageOut``, ``metering usage --format json``)."""
    return {
        "limit": usage.limit.name,
        "algorithm": usage.limit.algorithm,
        "enforcement": usage.limit.enforcement,
        "maximum": usage.limit.maximum,
        "used": usage.used,
        "remaining": usage.remaining,
        "overage": usage.overage,
        "window_start": _iso(usage.window_start),
        "resets_at": usage.resets_at.isoformat(),
        "retry_at": _iso(usage.retry_at),
        "grants_left": usage.grants_left,
        "exhausts_at": _iso(usage.exhausts_at),
        "time_zone": usage.time_zone,
        "local_window": usage.local_window,
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def subject_usage(database: Database, subject: str) -> list[LimitUsage]:
    """Every limit ``subject`` used or was denied in its current window, or
    has grants left of, by name."""
    validate_subject(subject)
    now_us = database.now_us()
    left = grants_left(list_grants(database, subject), from_us(now_us))
    return database.read(lambda c: _usage(c, subject, now_us, left))


def _usage(
    connection: Connection, subject: str, now_us: int, left: dict[str, int]
) -> list[LimitUsage]:
    store = Store(connection)
    limits = {limit.name: limit for limit in store.list_limits()}
    # The subject's own maximum where it has one, as the engines decide with.
    allowances = AllowanceStore(connection)
    histories = allowances.histories((name, subject) for name in limits)
    zones = allowances.time_zones([subject]).get(subject, ())
    limits = {
        name: limit.with_maximum(maximum_at(history, limit.maximum, now_us))
        if (history := histories.get((name, subject)))
        else limit
        for name, limit in limits.items()
    }
    first_use = [
        (name, subject)
        for name, limit in limits.items()
        if limit.algorithm == "fixed_window" and limit.window == "first_use"
    ]
    resolver = WindowResolver(store, dict(store.read_current_windows(first_use)))
    keys = {name: resolver.key(limit, subject, now_us) for name, limit in limits.items()}
    states = store.read_counters(keys.values())
    rates = store.read_rates(keys.values())
    # A missing counter reads as a fresh one: nothing used, nothing denied.
    return [
        labelled(
            forecast(
                usage_of(limits[name], key, states[key], now_us),
                left.get(name, 0),
                rates.get(key, (0, 0.0, 0)),
                now_us,
            ),
            zones,
        )
        for name, key in sorted(keys.items())
        if states[key] != CounterState() or name in left
    ]


def labelled(usage: LimitUsage, zones: ZoneHistory) -> LimitUsage:
    """``usage`` with its window's zone and local label, for a calendar window
    of a subject with time zones ``zones`` aligned in one of them."""
    limit = usage.limit
    if usage.window_start is None or limit.window != "calendar" or not zones:
        return usage
    window = (to_us(usage.window_start), to_us(usage.resets_at))
    label = window_label(limit.parsed_period, zones, window)
    if label is None:
        return usage
    return replace(usage, time_zone=label[0], local_window=label[1])


def forecast(
    usage: LimitUsage, grants: int, counter: tuple[int, float, int], now_us: int
) -> LimitUsage:
    """``usage`` with ``grants`` left and its exhaustion at ``counter``'s rate
    (its used, rate and the rate's instant)."""
    _, rate, rate_at_us = counter
    exhausts_at = None
    if usage.window_start is not None:
        exhausts_us = exhausts_at_us(
            usage.used,
            allowance(usage.used, usage.limit.maximum, grants),
            decayed(rate, rate_at_us, now_us),
            now_us,
            to_us(usage.resets_at),
        )
        exhausts_at = _moment(exhausts_us)
    return replace(usage, grants_left=grants, exhausts_at=exhausts_at)


def usage_of(limit: Limit, key: CounterKey, state: CounterState, now_us: int) -> LimitUsage:
    """The figures of one counter at ``now_us``, as a charge of 1 would meet them."""
    evaluation = evaluate_charge(ChargeInput(limit, key, state, 1), now_us)
    windowed = limit.algorithm == "fixed_window" and key.window_start_us != NO_WINDOW
    return LimitUsage(
        limit=limit,
        used=evaluation.used_before,
        remaining=evaluation.remaining_before,
        overage=max(evaluation.used_before - limit.maximum, 0),
        window_start=from_us(key.window_start_us) if windowed else None,
        resets_at=from_us(evaluation.resets_at_before_us),
        retry_at=None if evaluation.fits else _moment(evaluation.retry_at_us),
    )


def _moment(us: int | None) -> datetime | None:
    return from_us(us) if us is not None else None
