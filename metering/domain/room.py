"""Counters a batch cannot deny, decided in aggregate.

A fixed window's counter whose room (its maximum in force less its own usage,
plus its grants' when steady over the batch's times) covers the sum of every
cost the batch charges it fits each of those charges in any order: none is
denied or passes the maximum. `covered` finds those counters once per batch; an
event whose charges are all on them is allowed without evaluating its rules,
its rows written by `allowed_row` (or `drawn_row`) as `rules.decide` would.
Only limits that charge a plain sum and announce nothing when consumed qualify
(and a subject's own thresholds when the batch crosses none).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metering.domain.grants import History, Pot, maximum_at
from metering.domain.rules import USED, Key, Rule, State

Pair = tuple[str, str]  # (limit name, subject)
# A counter every charge of the batch fits: its maximum in force, and its
# grants (None: none) with what they paid of its window before the batch;
# or, when its own room fits them and its grants are steady (none pays), None
# and what the grants add to every charge's remaining (their window's share
# and what they hold: 0 without grants).
Room = tuple[int, Pot | None, int]
# A subject's own thresholds on a limit: (percentages, units) (`metering.alerts`).
Thresholds = tuple[Sequence[int], Sequence[int]]


def qualifies(rule: Rule) -> bool:
    """Whether ``rule``'s charges may be decided in aggregate."""
    return not (
        rule.bucket
        or rule.notifies
        or rule.concurrent
        or rule.gauge is not None
        or rule.pacing is not None
    )


@dataclass(slots=True)
class Sums:
    """What a batch charges each counter, gathered while it is planned.

    ``totals``: per fixed window's key, the sum of its charges' costs (or
    an upper bound of each: a seat's is 0 or 1, its charge's 1);
    ``poisoned``: pairs a charge of which has no known cost or key (a token
    bucket, a first-use window, a spend charge priced by its window's
    total); ``timed``: the entitled or granted pairs charged, and ``span``
    the first and last times of their charges: the batch's (wider than a
    pair's own only takes fewer pairs, never more).
    """

    totals: dict[Key, int] = field(default_factory=dict)
    poisoned: set[Pair] = field(default_factory=set)
    timed: set[Pair] = field(default_factory=set)
    span: tuple[int, int] | None = None


def covered(
    sums: Sums,
    rules: Mapping[str, Rule],
    states: Mapping[Key, State],
    histories: Mapping[Pair, History],
    pots: Mapping[Pair, Pot],
    alerts: Mapping[Pair, Thresholds],
) -> dict[Key, Room]:
    """The counters whose own room covers every charge of the batch (``sums``).

    ``alerts``: pairs with thresholds of their own, taken only without
    grants and when none is crossed from the counter's usage before the
    batch to that plus its total (`_crossed`). The maximum in force
    (``histories``) must not change over the batch's times (``sums.span``), and a pair with
    grants (``pots``) qualifies only when all of its counters do. Its grants
    count in the room only when the batch charges one counter of the pair and
    every grant is active over all of the batch's times or over none
    (`_held`): then each charge draws what `metering.domain.grants.fit_window` would.
    A counter whose own room fits the batch, of a pair whose grants are so
    steady, has no pot in its room: what they hold is the same to each charge.
    """
    poisoned, timed, span = sums.poisoned, sums.timed, sums.span
    qualified: dict[str, bool] = {}
    found: dict[Key, Room] = {}
    counters: set[Pair] | None = None  # found once a grant must pay
    for key, total in sums.totals.items():
        name, subject, start = key
        pair = (name, subject)
        ok = qualified.get(name)
        if ok is None:
            ok = qualified[name] = qualifies(rules[name])
        if not ok or pair in poisoned:
            poisoned.add(pair)
            continue
        own_alerts = alerts.get(pair) if alerts else None
        maximum = rules[name].maximum
        history = histories.get(pair) if histories else None
        if history:
            if span is None or pair not in timed:
                poisoned.add(pair)
                continue
            first, last = span
            if history[-1][0] <= first:  # (most: every change in force before the batch)
                if history[-1][1] is not None:
                    maximum = history[-1][1]
            elif _changes(history, first) != _changes(history, last):
                poisoned.add(pair)
                continue
            else:
                maximum = maximum_at(history, maximum, first)
        state = states.get(key)
        used = state[USED] if state is not None else 0
        pot = pots.get(pair) if pots else None
        if own_alerts is not None and (
            pot is not None or _crossed(own_alerts, maximum, used, used + total)
        ):
            poisoned.add(pair)
            continue
        granted = pot.granted.get(start, 0) if pot is not None else 0
        own = used - granted  # the window's own usage
        if own + total > maximum:
            if pot is None or own > maximum or span is None or pair not in timed:
                poisoned.add(pair)
                continue
            if counters is None:  # the pairs the batch charges in more than one window
                counters = set()
                totals = sums.totals
                if len(totals) > 1 and len({key[:2] for key in totals}) < len(totals):
                    seen: set[Pair] = set()
                    for counted, of, _ in totals:
                        if (counted, of) in seen:
                            counters.add((counted, of))
                        seen.add((counted, of))
            if pair in counters:
                poisoned.add(pair)
                continue
            held = _held(pot, *span)
            if held is None or own + total > maximum + held:
                poisoned.add(pair)
                continue
        elif pot is not None and span is not None and pair in timed:  # its grants pay none
            held = _held(pot, *span)
            if held is not None:  # nor does what they hold change
                found[key] = (maximum, None, granted + held)
                continue
        found[key] = (maximum, pot, granted)
    if not poisoned:
        return found
    return {key: room for key, room in found.items() if (key[0], key[1]) not in poisoned}


def _crossed(alerts: Thresholds, maximum: int, before: int, after: int) -> bool:
    """Whether usage going from ``before`` to ``after`` crosses one of
    ``alerts`` (as `metering.domain.notifications.notices_for` finds them)."""
    percents, units = alerts
    return any(before * 100 < p * maximum <= after * 100 for p in percents) or any(
        before < u <= after for u in units
    )


def _held(pot: Pot, first_us: int, last_us: int) -> int | None:
    """What ``pot``'s grants hold, when each is active from ``first_us``
    to ``last_us`` or at no time between (what `Pot.available` finds at
    any instant between); else None."""
    left = 0
    for balance in pot.balances:
        start, end = balance.effective_from_us, balance.expires_at_us
        if start <= first_us and (end is None or last_us < end):
            held = balance.amount - balance.used
            if held > 0:
                left += held
        elif not (start > last_us or (end is not None and end <= first_us)):
            return None
    return left


def drawn_row(
    subject: str,
    name: str,
    cost: int,
    state: State,
    room: Room,
    window: tuple[int, int],
    at_us: int,
) -> list[Any]:
    """The row of a charge on a covered counter with grants (`covered`),
    consumed: its own room first, then its grants pay the rest
    (`Pot.draw`), drawn on them in this window."""
    maximum, pot, _ = room
    assert pot is not None
    start = window[0]
    used = state[USED]
    granted = pot.granted
    own_room = maximum - used + granted.get(start, 0)  # >= 0: covered
    after = used + cost
    state[USED] = after
    wanted = cost - own_room
    if len(pot.balances) == 1:  # (most pots) `Pot.draw` of one grant, without its loop
        balance = pot.balances[0]
        available = balance.amount - balance.used
        expires = balance.expires_at_us
        draws: list[list[Any]] = []
        if (
            available > 0
            and balance.effective_from_us <= at_us
            and (expires is None or at_us < expires)
        ):
            if wanted > 0:
                taken = available if available < wanted else wanted
                balance.used += taken
                granted[start] = granted.get(start, 0) + taken
                draws = [[balance.grant_id, taken]]
        else:
            available = 0  # (used up, or not active at the charge: it pays nothing)
    else:
        available, draws = pot.draw(start, wanted, at_us)
    remaining = own_room + available - cost
    row = [subject, name, cost, True, "allowed", after, remaining, maximum, 0, *window, None]
    if wanted > 0:
        row.append(draws)
    return row


def _changes(history: History, at_us: int) -> int:
    """How many of ``history``'s changes are in force at ``at_us``."""
    return bisect_right(history, at_us, key=lambda change: change[0])


def allowed_row(
    subject: str,
    name: str,
    cost: int,
    state: State,
    room: Room,
    window: tuple[int, int],
) -> list[Any]:
    """The row of a charge on a covered counter without grants, or with
    grants that pay none of the batch (`covered`), consumed: its ``state``
    takes the cost."""
    maximum = room[0]
    after = state[USED] + cost
    state[USED] = after
    remaining = maximum - after + room[2]
    return [subject, name, cost, True, "allowed", after, remaining, maximum, 0, *window, None]
