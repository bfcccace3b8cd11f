"""The decision rules over plain values: what `consume` and the worker run.

`metering.domain.decisions.decide_event` states the rules with value objects, the clearest
statement of them; at tens of thousands of events a second the objects cost more than the
arithmetic. `decide` applies the same rules to a counter held as a mutable list (`State`)
and writes each charge's figures straight into the ledger's row (`ChargeRow`, in
`ChargeDecision.to_row` order). tests/engine/test_differential.py drives both with random
event streams and asserts identical results, counters and notifications. Only what may
notify builds value objects (a denial, consumption of a limit with thresholds or soft
enforcement); `notices_for` then decides, so the notification rules exist once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from metering.domain.decisions import ChargeDecision
from metering.domain.grants import Pot, fit_window
from metering.domain.limits import Limit, Period
from metering.domain.needs import NONE, Need, rule_needs
from metering.domain.notifications import Notice, notices_for
from metering.domain.pacing import (
    AHEAD_OF_PACE,
    Burst,
    ahead_of_pace,
    paced_maximum,
    paced_retry_us,
)
from metering.domain.state import NO_WINDOW, CounterKey, CounterState
from metering.domain.windows import gauge_level

# A counter as a list, in `CounterState` field order.
State = list[Any]
USED, DENIED_COUNT, DENIED_COST, FIRST_DENIED_AT, TAT, TAT_REM, TAT_SCALE = range(7)
ChargeRow = list[Any]  # `ChargeDecision.to_row()` order
Key = tuple[str, str, int]  # (limit name, subject, window start)


def fresh_state() -> State:
    return [0, 0, 0, None, None, 0, 1]


def state_of(state: State) -> CounterState:
    return CounterState(*state)


@dataclass(frozen=True, slots=True)
class Rule:
    """A limit prepared for deciding: the fields the arithmetic reads, unpacked once."""

    limit: Limit
    name: str
    maximum: int
    bucket: bool
    soft: bool
    shadow: bool  # never denies; records what a hard limit would have denied
    calendar: bool
    period: Period
    token_us: int  # a bucket's one token, in scaled microseconds
    lateness_us: int
    notifies: bool  # consuming may cross a threshold or the soft maximum
    dimensions: tuple[str, ...]  # metadata keys its usage is rolled up by
    concurrent: bool = False  # a floating license: never consumed (`WrongAlgorithm`)
    # Priced, or a spend limit: its events get their spend charges (`metering.engine.money`).
    money: bool = False
    # Counts distinct values (seats): a charge costs what `metering.domain.distinct` says.
    distinct: bool = False
    # What deciding a charge of it needs from a path (`metering.domain.needs`).
    needs: frozenset[Need] = NONE
    # A gauge's aggregation (``max`` or ``latest``): a charge reports a level
    # (`metering.domain.windows.gauge_level`); None: costs add up.
    gauge: str | None = None
    # A paced window's burst (`metering.domain.pacing`); None: not paced.
    pacing: Burst | None = None

    @classmethod
    def of(cls, limit: Limit, *, priced: bool = False) -> Rule:
        return cls(
            limit=limit,
            name=limit.name,
            maximum=limit.maximum,
            bucket=limit.algorithm == "token_bucket",
            soft=limit.enforcement == "soft",
            shadow=limit.enforcement == "shadow",
            calendar=limit.window == "calendar",
            period=limit.parsed_period,
            token_us=limit.period_seconds * 1_000_000,
            lateness_us=limit.lateness_seconds * 1_000_000,
            notifies=bool(limit.thresholds or limit.thresholds_units)
            or limit.enforcement == "soft",
            dimensions=limit.dimensions,
            concurrent=limit.algorithm == "concurrent",
            money=priced or limit.currency is not None,
            distinct=limit.distinct is not None,
            needs=rule_needs(limit, priced=priced),
            gauge=limit.aggregation if limit.is_gauge else None,
            pacing=limit.burst if limit.pacing else None,
        )

    def with_maximum(self, maximum: int) -> Rule:
        """This rule for a subject with its own maximum (an entitlement): a
        copy, slot by slot (`dataclasses.replace` costs twice as much)."""
        if maximum == self.maximum:
            return self
        copy = object.__new__(Rule)
        for name in _RULE_SLOTS:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "maximum", maximum)
        return copy

    def with_thresholds(self, thresholds: tuple[int, ...], units: tuple[int, ...]) -> Rule:
        """This rule for a subject with thresholds of its own (`metering.allowances.alerts`),
        as the general engine announces them (`notices_of`'s ``own``)."""
        limit = replace(self.limit, thresholds=thresholds, thresholds_units=units)
        return replace(self, limit=limit, notifies=bool(thresholds or units) or self.soft)


_RULE_SLOTS: Final = Rule.__slots__  # every field of a `Rule`

# What one charge would do, as a tuple (see `_window` and `_bucket`):
# fits, used before, used after, remaining before, remaining after,
# resets_at after consuming, resets_at before, retry_at, overage after,
# a bucket's arrival time after consuming (None for a window; a `latest`
# gauge's instant of its level), overage
# before, and the grants that pay if it is consumed.
_Figures = tuple[
    bool,
    int,
    int,
    int,
    int,
    int,
    int,
    int | None,
    int,
    int | None,
    int,
    tuple[tuple[str, int], ...],
]
NO_DRAWS: Final[tuple[tuple[str, int], ...]] = ()


def _gauge(rule: Rule, state: State, value: int, end_us: int, at_us: int) -> _Figures:
    # Exactly `windows._evaluate_gauge`, over the list; the level's instant
    # (a ``latest`` gauge's) goes where a bucket's arrival time would.
    assert rule.gauge is not None
    maximum = rule.maximum
    used = state[USED]
    level, level_at = gauge_level(rule.gauge, used, state[TAT], value, at_us)
    return (
        rule.soft or value <= maximum,
        used,
        level,
        maximum - used if used < maximum else 0,
        maximum - level if level < maximum else 0,
        end_us,
        end_us,
        None,
        level - maximum if rule.soft and level > maximum else 0,
        level_at,
        used - maximum if used > maximum else 0,
        NO_DRAWS,
    )


def _window(
    rule: Rule, state: State, cost: int, window: tuple[int, int], at_us: int, pot: Pot | None
) -> _Figures:
    if rule.gauge is not None:
        return _gauge(rule, state, cost, window[1], at_us)
    if rule.pacing is not None:
        return _paced(rule, rule.pacing, state, cost, window, at_us, pot)
    maximum = rule.maximum
    used = state[USED]
    after = used + cost
    end_us = window[1]
    # A cost of 0 (a seat already held, `metering.domain.distinct`) always
    # fits and adds no overage, as `windows.evaluate_window` says.
    free = cost == 0
    if pot is not None:
        granted = pot.granted.get(window[0], 0)
        fit = fit_window(maximum, used, granted, cost, pot, at_us, soft=rule.soft)
        fits = rule.soft or fit.fits or free
        return (
            fits,
            used,
            after,
            fit.remaining_before,
            fit.remaining_after,
            end_us,
            end_us,
            # Next window: its own allowance again, and the grants still active then.
            end_us if not fits and cost <= maximum + pot.available(end_us) else None,
            0 if free else fit.overage_after,
            None,
            fit.overage_before,
            fit.draws,
        )
    fits = rule.soft or after <= maximum or free
    retry = end_us if not fits and cost <= maximum else None
    remaining_before = maximum - used if used < maximum else 0
    remaining_after = maximum - after if after < maximum else 0
    overage = after - maximum if after > maximum and not free else 0
    return (
        fits,
        used,
        after,
        remaining_before,
        remaining_after,
        end_us,
        end_us,
        retry,
        overage,
        None,
        used - maximum if used > maximum else 0,
        NO_DRAWS,
    )


def _paced(
    rule: Rule,
    burst: Burst,
    state: State,
    cost: int,
    window: tuple[int, int],
    at_us: int,
    pot: Pot | None,
) -> _Figures:
    # Exactly `windows.evaluate_window` for a paced limit: a hard or shadow
    # window's own allowance is its pace; overage counts against the maximum.
    maximum = rule.maximum
    used = state[USED]
    after = used + cost
    end_us = window[1]
    free = cost == 0
    allowance = maximum if rule.soft else paced_maximum(maximum, burst, window, at_us)
    draws = NO_DRAWS
    if pot is None:
        own_used, available = used, 0
        fits = after <= allowance
        remaining_before = allowance - used if used < allowance else 0
        remaining_after = allowance - after if after < allowance else 0
        overage_after = after - maximum if after > maximum else 0
        overage_before = used - maximum if used > maximum else 0
    else:
        granted = pot.granted.get(window[0], 0)
        own_used, available = used - granted, pot.available(at_us)
        fit = fit_window(allowance, used, granted, cost, pot, at_us, soft=rule.soft)
        fits, draws = fit.fits, fit.draws
        remaining_before, remaining_after = fit.remaining_before, fit.remaining_after
        own_after = own_used + cost - sum(amount for _, amount in draws)
        overage_after = own_after - maximum if own_after > maximum else 0
        overage_before = own_used - maximum if own_used > maximum else 0
    fits = rule.soft or fits or free
    retry = None
    if not fits:
        retry = paced_retry_us(maximum, burst, window, own_used + cost - available, at_us)
    if not fits and retry is None:
        # Next window: its own allowance again, and the grants still active then.
        extra = 0 if pot is None else pot.available(end_us)
        retry = end_us if cost <= maximum + extra else None
    return (
        fits,
        used,
        after,
        remaining_before,
        remaining_after,
        end_us,
        end_us,
        retry,
        0 if free else overage_after,
        None,
        overage_before,
        draws,
    )


def _ahead(
    rule: Rule, f: _Figures, cost: int, window: tuple[int, int], at_us: int, pot: Pot | None
) -> bool:
    """A consumed soft paced charge past the pace, within the maximum."""
    if rule.pacing is None or not rule.soft or cost == 0 or f[8] > 0:
        return False
    granted = 0 if pot is None else pot.granted.get(window[0], 0)
    return ahead_of_pace(rule.maximum, rule.pacing, window, f[2] - granted, at_us)


def _bucket(rule: Rule, state: State, cost: int, at_us: int) -> _Figures:
    # Exactly `buckets.evaluate_bucket`, over the list.
    capacity = rule.maximum
    token = rule.token_us
    now_scaled = at_us * capacity
    base = now_scaled
    if state[TAT] is not None:
        scale = state[TAT_SCALE]
        scaled = -(-(state[TAT] * scale + state[TAT_REM]) * capacity // scale)
        base = max(scaled, now_scaled)
    available = max((capacity * token - (base - now_scaled)) // token, 0)
    fits = cost <= available
    new_tat = base + cost * token
    applied_tat = new_tat if fits else base
    retry = None
    if not fits and cost <= capacity:
        retry = -(-(base + cost * token - capacity * token) // capacity)
    used_before = capacity - available
    return (
        fits,
        used_before,
        used_before + cost,
        available,
        available - cost if fits else available,
        -(-applied_tat // capacity),
        -(-base // capacity),
        retry,
        0,
        new_tat,
        0,
        NO_DRAWS,
    )


@dataclass(slots=True)
class EventOutcome:
    """One decided event: its outcome, charge rows and the limits that denied it."""

    outcome: str
    rows: list[ChargeRow]
    denied_by: tuple[str, ...]


def decide(
    rules: Sequence[Rule],
    charges: Sequence[tuple[str, str, int]],
    windows: Sequence[tuple[int, int]],
    states: Sequence[State],
    at_us: int,
    event_id: str | None,
    notices: list[Notice] | None,
    pots: Sequence[Pot | None] | None = None,
) -> EventOutcome:
    """Decide one event against ``states`` and update them in place.

    Every hard charge must fit or none consumes (SPEC invariant 3); a
    shadow charge never denies, and consumes only what would have fit. The
    candidate notifications are appended to ``notices`` (None: not wanted).
    ``pots`` holds each charge's grants (None: the subject has none); the
    grants that pay are drawn on them in place.
    """
    # Most events: one charge (else `zip` refuses what does not line up).
    if len(rules) == len(charges) == len(windows) == len(states) == 1:
        pot = None if pots is None else pots[0]
        return _decide_one(
            rules[0], charges[0], windows[0], states[0], at_us, event_id, notices, pot
        )
    if pots is None:
        pots = [None] * len(rules)
    figures = [
        _bucket(rule, state, charge[2], at_us)
        if rule.bucket
        else _window(rule, state, charge[2], window, at_us, pot)
        for rule, charge, window, state, pot in zip(
            rules, charges, windows, states, pots, strict=True
        )
    ]
    denied_by = tuple(
        rule.name for rule, f in zip(rules, figures, strict=True) if not f[0] and not rule.shadow
    )
    allowed = not denied_by
    rows: list[ChargeRow] = []
    overage = False
    for index, f in enumerate(figures):
        rule, state = rules[index], states[index]
        subject, _, cost = charges[index]
        window_start = None if rule.bucket else windows[index][0]
        maximum = rule.maximum
        consumed = allowed and f[0]
        if consumed:
            outcome = "overage" if f[8] > 0 else "allowed"
            if rule.pacing is not None and _ahead(
                rule, f, cost, windows[index], at_us, pots[index]
            ):
                outcome = AHEAD_OF_PACE
            overage = overage or f[8] > 0
            row = [subject, rule.name, cost, True, outcome, f[2], f[4], maximum, f[8]]
            row += [window_start, f[5], f[7]]
            if f[11]:
                row.append([list(draw) for draw in f[11]])
                pot = pots[index]
                assert pot is not None and window_start is not None
                pot.take(window_start, f[11])
        else:
            outcome = "allowed" if f[0] else ("would_deny" if rule.shadow else "denied")
            row = [subject, rule.name, cost, f[0] or rule.shadow, outcome, f[1], f[3]]
            row += [maximum, f[10], window_start, f[6], f[7]]
        rows.append(row)
        if notices is not None and (
            (not f[0] and (rule.bucket or state[DENIED_COUNT] == 0)) or (consumed and rule.notifies)
        ):
            before = state_of(state)
            _apply(rule, state, f, cost, at_us, consumed)
            key = CounterKey(rule.name, subject, *windows[index])
            charge = ChargeDecision.from_row(row)
            notices += notices_for(rule.limit, key, before, state_of(state), charge, event_id)
        else:
            _apply(rule, state, f, cost, at_us, consumed)
    outcome = "denied" if denied_by else ("overage" if overage else "allowed")
    return EventOutcome(outcome, rows, denied_by)


def _decide_one(
    rule: Rule,
    charge: tuple[str, str, int],
    window: tuple[int, int],
    state: State,
    at_us: int,
    event_id: str | None,
    notices: list[Notice] | None,
    pot: Pot | None = None,
) -> EventOutcome:
    """`decide` for one charge, written out (a batch decides mostly these;
    `consume` all of its): ``pot`` its grants (None: none), drawn on in
    place. The differential tests hold it to `decide_event` too."""
    subject, _, cost = charge
    if rule.bucket:
        f = _bucket(rule, state, cost, at_us)
        window_start = None
    else:
        f = _window(rule, state, cost, window, at_us, pot)
        window_start = window[0]
    fits = f[0]
    # Consumed exactly when it fits: a lone charge that fits denies nothing.
    if fits:
        overage = f[8] > 0
        outcome = "overage" if overage else "allowed"
        if rule.pacing is not None and _ahead(rule, f, cost, window, at_us, pot):
            outcome = AHEAD_OF_PACE
        row = [subject, rule.name, cost, True, outcome, f[2], f[4], rule.maximum, f[8]]
        row += [window_start, f[5], f[7]]
        if f[11]:
            row.append([list(draw) for draw in f[11]])
            assert pot is not None and window_start is not None
            pot.take(window_start, f[11])
        denied_by: tuple[str, ...] = ()
    else:
        overage = False
        outcome = "would_deny" if rule.shadow else "denied"
        row = [subject, rule.name, cost, rule.shadow, outcome, f[1], f[3], rule.maximum, f[10]]
        row += [window_start, f[6], f[7]]
        denied_by = () if rule.shadow else (rule.name,)
    if notices is not None and (
        (not fits and (rule.bucket or state[DENIED_COUNT] == 0)) or (fits and rule.notifies)
    ):
        before = state_of(state)
        _apply(rule, state, f, cost, at_us, fits)
        key = CounterKey(rule.name, subject, *window)
        decided = ChargeDecision.from_row(row)
        notices += notices_for(rule.limit, key, before, state_of(state), decided, event_id)
    else:
        _apply(rule, state, f, cost, at_us, fits)
    return EventOutcome(
        "denied" if denied_by else ("overage" if overage else "allowed"), [row], denied_by
    )


def grants_low(
    pots: Mapping[tuple[str, str], Pot], watched: Mapping[str, int], drawn: Iterable[str]
) -> list[str]:
    """The grants among ``drawn`` (drawn on by a batch) that the batch left
    at or below their ``low`` threshold (``watched``: the threshold of each
    grant that has not announced ``grant.low`` yet), sorted: those announce
    it (`metering.domain.recurring`)."""
    wanted = {grant_id for grant_id in drawn if grant_id in watched}
    if not wanted:
        return []
    left = {b.grant_id: b.left for pot in pots.values() for b in pot.balances}
    return sorted(g for g in wanted if g in left and left[g] <= watched[g])


def _apply(rule: Rule, state: State, f: _Figures, cost: int, at_us: int, consumed: bool) -> None:
    if consumed and rule.gauge is not None:
        state[USED] = f[2]  # the level, not a sum
        if f[9] is not None:
            state[TAT] = f[9]
    elif consumed:
        state[USED] += cost
        if rule.bucket:
            assert f[9] is not None
            state[TAT], state[TAT_REM] = divmod(f[9], rule.maximum)
            state[TAT_SCALE] = rule.maximum
    elif not f[0]:
        state[DENIED_COUNT] += 1
        state[DENIED_COST] += cost
        if state[FIRST_DENIED_AT] is None:
            state[FIRST_DENIED_AT] = at_us


BUCKET_WINDOW: Final = (NO_WINDOW, NO_WINDOW)
