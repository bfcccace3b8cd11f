"""The single event in one round trip on PostgreSQL (issue 20, point 3).

`prepare` turns an event into the call of ``metering_consume_one``
(`metering.storage.hot.one_trip`) from the cached limits, or answers None where
Python need not even ask: an unknown limit or an out-of-range time (the
usual path rejects it with its message), a subject with grants (a
recurring grant's issue due among them) or thresholds of its own, a limit
rolled up by dimensions, a distinct limit (seats), a first-use window in calendar months, one
(limit, subject) charged twice, a priced limit. Entitlements are decided here: the
function gets each subject's maximum at the event, from the cache's
histories. Whatever the function declines, the caller applies the usual way
(`metering.engine.fast.apply_records`), so the Python rules stay the
reference; ``tests/engine/test_differential.py`` holds the two to the same
results, counters and notifications.

`STATS` counts, per process, the events the function decided and what it
declined (``declined:<code>``), so tests can tell it really ran.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from metering.domain.events import EventRecord
from metering.domain.rules import Rule
from metering.domain.windows import calendar_window
from metering.engine.fast import LimitCache, UseGeneralPath, _rules_for
from metering.storage.hot.one_trip import OneCharge, call_parameters

STATS: Final[Counter[str]] = Counter()


def prepare(cache: LimitCache, event: EventRecord, now_us: int) -> tuple[Any, ...] | None:
    """The parameters of the function's call for ``event``, or None: not for it."""
    version, rules, allowances = cache.current
    if version < 0:
        return None
    try:
        event_rules, error = _rules_for(event, rules, now_us, seats=False)
    except UseGeneralPath:
        return None  # seats: the function counts none
    if error is not None or any(rule.money for rule in event_rules):
        return None  # a priced limit: `apply_records` decides money
    charges = event.charges
    if len(charges) > 1 and len({(name, subject) for subject, name, _ in charges}) < len(charges):
        return None
    grant_pairs = allowances.grant_pairs
    histories = allowances.histories
    at_us = event.occurred_at_us
    found: list[OneCharge] = []
    for (subject, name, cost), rule in zip(charges, event_rules, strict=True):
        if rule.dimensions or (grant_pairs and (name, subject) in grant_pairs):
            return None
        if (name, subject) in allowances.alerts:
            return None  # thresholds of its own: the Python rules announce them
        if histories:
            history = histories.get((name, subject))
            if history:
                rule = cache.rule_for(rule, history, at_us)
        found.append(_charge(rule, subject, cost, at_us))
        if found[-1][3] == "":
            return None
    return call_parameters(
        version, event.event_id, event.fingerprint, at_us, now_us, event.metadata, found
    )


def _charge(rule: Rule, subject: str, cost: int, at_us: int) -> OneCharge:
    limit = rule.limit
    thresholds = (limit.thresholds, limit.thresholds_units)
    enforcement = "soft" if rule.soft else ("shadow" if rule.shadow else "hard")
    if rule.bucket:
        kind, start, end = "b", 0, 0
    elif rule.calendar:
        kind = "c"
        start, end = calendar_window(rule.period, at_us)
    elif rule.period.is_calendar_months:
        kind, start, end = "", 0, 0  # the function adds microseconds, not months
    else:
        kind, start, end = "f", 0, rule.period.seconds * 1_000_000
    return (
        rule.name,
        subject,
        cost,
        kind,
        rule.maximum,
        enforcement,
        rule.token_us,
        start,
        end,
        *thresholds,
    )
