"""The single plain event in one round trip on PostgreSQL.

`prepare` turns an event into the call of ``metering_consume_one``
(`metering.storage.hot.one_trip`), a PL/pgSQL copy of the lean rules of
`metering.domain.rules`, from the cached limits. It implements a narrow set
(`ONE_TRIP_IMPLEMENTS`: plain hard, soft and shadow limits, buckets, calendar and
first-use windows, stacked charges, seats, the subject's entitlements, grants
and recurring grants with no issue due, and own thresholds, which only choose
when it declines to notify); any other
need, or an unacceptable event, is `Declined` and the fast path decides.
``tests/engine/test_differential.py`` holds the function to the reference.

`STATS` counts, per process, the events the function decided and what it
declined (``declined:<code>``), so tests can tell it really ran.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from metering.domain.distinct import value_of
from metering.domain.events import EventRecord
from metering.domain.needs import Need
from metering.domain.rules import Rule
from metering.domain.windows import calendar_window
from metering.engine.answers import Declined
from metering.engine.fast import LimitCache, rules_for
from metering.storage.hot.one_trip import OneCharge, call_parameters

STATS: Final[Counter[str]] = Counter()
ONE_TRIP_IMPLEMENTS: Final = frozenset(
    {Need.ENTITLEMENTS, Need.OWN_THRESHOLDS, Need.SEATS, Need.GRANTS, Need.RECURRING}
)


def prepare(cache: LimitCache, event: EventRecord, now_us: int) -> tuple[Any, ...] | Declined:
    """The parameters of the function's call for ``event``, or why not."""
    version, rules, allowances = cache.current
    if version < 0:
        return Declined("the limits are not loaded yet", stale=True)
    event_rules, error = rules_for(event, rules, now_us)
    if error is not None:
        return Declined(str(error), Need.INVALID)
    needs = allowances.charged(rules, [event]) - ONE_TRIP_IMPLEMENTS
    if needs:
        return Declined("not for the function", min(needs))
    if allowances.due and allowances.due_pairs(((n, s) for s, n, _ in event.charges), now_us):
        return Declined("a recurring grant's issue is due", Need.RECURRING)
    histories, alerts, granted = allowances.histories, allowances.alerts, allowances.grant_pairs
    at_us = event.occurred_at_us
    found: list[OneCharge] = []
    for (subject, name, cost), rule in zip(event.charges, event_rules, strict=True):
        if histories or alerts:
            history, own = histories.get((name, subject)), alerts.get((name, subject))
            if history or own:
                rule = cache.rule_for(rule, history, at_us, own)
        # (`rules_for` found the seat's value acceptable.)
        key = rule.limit.distinct
        seat = None if key is None else value_of(key, name, event.metadata, cost)
        found.append(_charge(rule, subject, cost, at_us, seat, (name, subject) in granted))
    return call_parameters(
        version, event.event_id, event.fingerprint, at_us, now_us, event.metadata, found
    )


def _charge(
    rule: Rule, subject: str, cost: int, at_us: int, seat: str | None, granted: bool
) -> OneCharge:
    limit = rule.limit
    thresholds = (limit.thresholds, limit.thresholds_units)
    enforcement = "soft" if rule.soft else ("shadow" if rule.shadow else "hard")
    if rule.bucket:
        kind, start, end = "b", 0, 0
    elif rule.calendar:
        kind = "c"
        start, end = calendar_window(rule.period, at_us)
    else:  # a first-use window of calendar months is declined (`Need.MONTH_FIRST_USE`)
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
        seat,
        granted,
    )
