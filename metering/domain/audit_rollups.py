"""The rollups billing reads, from the ledger: the `rollup_ledger` invariant's rule.

`RollupLedger` sums per rollup key what each unvoided result consumed (outcome allowed or
overage; a shadow charge's would-deny nothing): for each dimension its limit had when it was
decided (`metering.domain.dimension_history.in_force`) the charge's cost, for a priced
charge its amount under ``$spend``, in the UTC hour of ``occurred_at``, one event each. A
commit rewrote its result (more units; the money kept); what a cancel or a commit of less
gave back (`Settlement`) comes off, and the event when all of a charge came back. A voided
event counts nothing; a reset takes nothing off.
`judge_rollups` names each judged row whose ``used`` or ``events`` differ, and any below 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.audit import Invariant, Violation
from metering.domain.dimension_history import Era, ever_dimensioned, in_force
from metering.domain.rollups import (
    CONSUMED,
    SPEND_DIMENSION,
    WOULD_DENY,
    RollupKey,
    dimension_value,
    hour_start_us,
)

# (subject, limit, hour start): the rows of one limit's hour.
Hour = tuple[str, str, int]
# (subject, limit): one charge of an event.
Pair = tuple[str, str]

# The fields of a ledger row (`ChargeDecision.to_row`) read here.
_SUBJECT, _LIMIT, _COST, _OUTCOME, _PRICE = 0, 1, 2, 4, 13


@dataclass(frozen=True, slots=True)
class Settlement:
    """A reservation a cancel or a commit settled, as the ledger has it: the
    cost of each charge it still held (a reset drops the charges it clears)
    and the units ``given_back`` of those whose counter took them, and of
    those a reset dropped, the units released off the reports (a commit's
    money back is in its rewritten result, not here)."""

    held: Mapping[Pair, int]
    given_back: Mapping[Pair, int]


class RollupLedger:
    """Expected rollup rows (``rows``: key to [used, events]) from results
    given one by one (`add`, `voided`); the hours whose rows the ledger cannot
    say: ``stale``, the dimension rows of a limit's hour with a result whose
    dimensions its history does not know (written before it); ``unknown``, the
    ``used`` of every usage row of a seat limit's hour with a voided event (a
    void frees a seat only with its value's last live event: docs/seats.md);
    their ``events`` are the live events'.

    ``history``: each limit's dimension history (those with dimensions in no
    era are left out); ``seats``: the seat limits (``distinct``).
    """

    def __init__(
        self,
        history: Mapping[str, Sequence[Era]],
        seats: frozenset[str] = frozenset(),
    ) -> None:
        self.history = {name: eras for name, eras in history.items() if ever_dimensioned(eras)}
        self.seats = seats
        self.rows: dict[RollupKey, list[int]] = {}
        self.stale: set[Hour] = set()
        self.unknown: set[Hour] = set()

    def counts(self, charges: Sequence[Sequence[Any]]) -> bool:
        """Whether a result has rollup rows to count: a charge of a limit with
        dimensions, or a priced one."""
        for row in charges:
            if row[_LIMIT] in self.history or (len(row) > _PRICE and row[_PRICE] is not None):
                return True
        return False

    def voided(
        self, occurred_at_us: int, decided_at_us: int, tick: int, charges: Sequence[Sequence[Any]]
    ) -> None:
        """A voided result (written at the reset clock's ``tick``): it counts
        nothing (its seat limits' hours unknown, and stale as `add` finds them)."""
        hour = hour_start_us(occurred_at_us)
        for row in charges:
            found = (str(row[_SUBJECT]), str(row[_LIMIT]), hour)
            if found[1] in self.seats:
                self.unknown.add(found)
            if self._keys(found[1], tick, decided_at_us) is None:
                self.stale.add(found)

    def _keys(self, limit: str, tick: int, decided_at_us: int) -> tuple[str, ...] | None:
        """The dimensions ``limit`` had for a result (None: unknown)."""
        eras = self.history.get(limit)
        return () if eras is None else in_force(eras, tick, decided_at_us)

    def add(
        self,
        outcome: str,
        occurred_at_us: int,
        decided_at_us: int,
        tick: int,
        charges: Sequence[Sequence[Any]],
        metadata: Mapping[str, Any] | None,
        settlement: Settlement | None = None,
    ) -> None:
        """Count one unvoided result, written at the reset clock's ``tick``."""
        if outcome not in CONSUMED:
            return
        hour = hour_start_us(occurred_at_us)
        for row in charges:
            if row[_OUTCOME] == WOULD_DENY:
                continue
            pair = (str(row[_SUBJECT]), str(row[_LIMIT]))
            cost = int(row[_COST])
            back = 0 if settlement is None else settlement.given_back.get(pair, 0)
            charged = cost if settlement is None else settlement.held.get(pair, cost)
            # A spend charge a commit rewrote to 0 gave all its money back.
            gone = 0 < charged <= back or 0 == cost < charged
            keys = self._keys(pair[1], tick, decided_at_us)
            if keys is None:
                self.stale.add((*pair, hour))
            else:
                for key in keys:
                    value = dimension_value(metadata, key)
                    self._count((*pair, key, hour, value), cost - back, gone)
            if len(row) > _PRICE and row[_PRICE] is not None:
                currency, amount = row[_PRICE]
                spent = (*pair, SPEND_DIMENSION, hour, str(currency))
                self._count(spent, 0 if gone else int(amount), gone)

    def _count(self, key: RollupKey, used: int, gone: bool) -> None:
        figures = self.rows.setdefault(key, [0, 0])
        figures[0] += used
        figures[1] += 0 if gone else 1


MISSING: Final = (0, 0)


def judge_rollups(
    expected: Mapping[RollupKey, Sequence[int]],
    found: Mapping[RollupKey, Sequence[int]],
    judged: Callable[[RollupKey], bool],
    signed: Callable[[RollupKey], bool] = lambda key: True,
    counted: Callable[[RollupKey], bool] = lambda key: False,
) -> list[Violation]:
    """Each ``judged`` row (of either side) whose ``used`` or ``events``
    differ from the ledger's (a row missing is (0, 0)), each ``counted`` one
    whose ``events`` differ, and each other ``signed`` row below zero (no
    ledger takes more off a row than it added), in key order."""
    differ = [
        key
        for key, got in found.items()
        if (want := expected.get(key, MISSING))[0] != got[0] or want[1] != got[1]
    ]
    differ += [key for key, want in expected.items() if key not in found and any(want)]
    violations = []
    for key in sorted(differ):
        if not signed(key):
            continue
        want, got = expected.get(key, MISSING), found.get(key, MISSING)
        row = f"{key[2]} {key[4]!r}"
        if judged(key):
            violations.append(_violation(key, f"{row}: used {want[0]}, events {want[1]}", got))
        elif counted(key) and want[1] != got[1]:
            violations.append(_violation(key, f"{row}: events {want[1]}", got))
        elif min(got) < 0:
            violations.append(_violation(key, f"{row}: used >= 0, events >= 0", got))
    return violations


def _violation(key: RollupKey, expected: str, got: Sequence[int]) -> Violation:
    subject, limit, dimension, hour, value = key
    found = f"{dimension} {value!r}: used {got[0]}, events {got[1]}"
    return Violation(Invariant.ROLLUP_LEDGER, subject, limit, hour, expected=expected, found=found)
