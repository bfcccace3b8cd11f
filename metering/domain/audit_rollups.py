"""The rollups billing reads, from the ledger: the `rollup_ledger` invariant's rule.

`RollupLedger` sums per rollup key what each unvoided result consumed (outcome allowed or
overage; a shadow charge's would-deny nothing): for each of its limit's ``dimensions`` the
charge's cost, for a priced charge its amount under ``$spend``, in the UTC hour of
``occurred_at``, one event each. A commit rewrote its result (more units; the money kept);
what a cancel or a commit of less gave back (`Settlement`) comes off, and the event when all
of a charge came back. A voided event counts nothing; a reset takes nothing off.
`judge_rollups` names each judged row whose ``used`` or ``events`` differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.audit import Invariant, Violation
from metering.domain.rollups import (
    CONSUMED,
    SPEND_DIMENSION,
    WOULD_DENY,
    RollupKey,
    dimension_value,
    hour_start_us,
)
from metering.domain.state import NO_WINDOW

# (subject, limit, hour start, whether the ``$spend`` rows): what a row is judged by.
Hour = tuple[str, str, int, bool]
# (subject, limit): one charge of an event.
Pair = tuple[str, str]
# A held charge's cost and window (start, end), as `reservations.charges` has it.
Held = tuple[int, int, int]

# The fields of a ledger row (`ChargeDecision.to_row`) read here.
_SUBJECT, _LIMIT, _COST, _OUTCOME, _PRICE = 0, 1, 2, 4, 13


@dataclass(frozen=True, slots=True)
class Settlement:
    """A reservation settled with something given back, as the ledger has it:
    cancelled (else committed with an actual) at ``settled_at_us``; its
    ``held`` charges; the units ``given_back`` per charge whose counter took
    them; the charges a reset cleared between its result and the settle (their
    counters took nothing, the rollups did); the charges on spend limits (a
    commit's money back is in its rewritten result)."""

    cancelled: bool
    settled_at_us: int
    held: Mapping[Pair, Held]
    given_back: Mapping[Pair, int]
    cleared: frozenset[Pair] = frozenset()
    spend: frozenset[Pair] = frozenset()

    def units_back(self, pair: Pair) -> int | None:
        """What went back of ``pair``'s charge (None: the ledger cannot say:
        a commit whose actual no counter recorded)."""
        if pair in self.given_back:
            return self.given_back[pair]
        held = self.held.get(pair)
        if held is None or pair not in self.cleared:
            return 0
        cost, _, end = held
        if end != NO_WINDOW and self.settled_at_us >= end:
            return 0  # its window had ended: nothing went back
        if self.cancelled:
            return cost
        if pair in self.spend:
            return 0
        kept = {
            self.held[p][0] - units
            for p, units in self.given_back.items()
            if p in self.held and p not in self.spend
        }
        return max(cost - kept.pop(), 0) if len(kept) == 1 else None


class RollupLedger:
    """Expected rollup rows (``rows``: key to [used, events]) from results
    given one by one (`add`); ``unknown``: the hours whose rows the ledger
    cannot say (a limit redefined after a result, a commit's actual unknown).

    ``dimensions``: each limit's keys now; ``defined_at_us``: when each limit
    was last defined (a result decided before: its dimension rows unknown).
    """

    def __init__(
        self, dimensions: Mapping[str, Sequence[str]], defined_at_us: Mapping[str, int]
    ) -> None:
        self.dimensions = dimensions
        self.defined_at_us = defined_at_us
        self.rows: dict[RollupKey, list[int]] = {}
        self.unknown: set[Hour] = set()

    def add(
        self,
        outcome: str,
        occurred_at_us: int,
        decided_at_us: int,
        charges: Sequence[Sequence[Any]],
        metadata: Mapping[str, Any] | None,
        settlement: Settlement | None = None,
    ) -> list[Hour]:
        """Count one unvoided result; the hours it counts in."""
        if outcome not in CONSUMED:
            return []
        hour = hour_start_us(occurred_at_us)
        hours: list[Hour] = []
        for row in charges:
            if row[_OUTCOME] == WOULD_DENY:
                continue
            pair = (str(row[_SUBJECT]), str(row[_LIMIT]))
            cost = int(row[_COST])
            back = 0 if settlement is None else settlement.units_back(pair)
            charged = cost if settlement is None else settlement.held.get(pair, (cost,))[0]
            gone = back is not None and 0 < charged <= back
            keys = self.dimensions.get(pair[1], ())
            if keys:
                hours.append((*pair, hour, False))
                stale = decided_at_us < self.defined_at_us.get(pair[1], decided_at_us)
                if back is None or stale:
                    self.unknown.add((*pair, hour, False))
                else:
                    for key in keys:
                        value = dimension_value(metadata, key)
                        self._count((*pair, key, hour, value), cost - back, gone)
            if len(row) > _PRICE and row[_PRICE] is not None:
                hours.append((*pair, hour, True))
                if back is None:
                    self.unknown.add((*pair, hour, True))
                    continue
                currency, amount = row[_PRICE]
                spent = (*pair, SPEND_DIMENSION, hour, str(currency))
                self._count(spent, 0 if gone else int(amount), gone)
        return hours

    def _count(self, key: RollupKey, used: int, gone: bool) -> None:
        figures = self.rows.setdefault(key, [0, 0])
        figures[0] += used
        figures[1] += 0 if gone else 1


MISSING: Final = (0, 0)


def judge_rollups(
    expected: Mapping[RollupKey, Sequence[int]],
    found: Mapping[RollupKey, Sequence[int]],
    judged: Callable[[RollupKey], bool],
) -> list[Violation]:
    """Each judged row (of either side) whose ``used`` or ``events`` differ
    from the ledger's: a row missing is (0, 0)."""
    violations = []
    for key in sorted(set(expected) | set(found)):
        want = tuple(expected.get(key, MISSING))
        got = tuple(found.get(key, MISSING))
        if want == got or not judged(key):
            continue
        subject, limit, dimension, hour, value = key
        row = f"{dimension} {value!r}"
        violations.append(
            Violation(
                Invariant.ROLLUP_LEDGER,
                subject,
                limit,
                hour,
                expected=f"{row}: used {want[0]}, events {want[1]}",
                found=f"{row}: used {got[0]}, events {got[1]}",
            )
        )
    return violations
