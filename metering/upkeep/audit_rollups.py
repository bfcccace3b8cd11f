"""The `rollup_ledger` check of a full or ``since`` audit run (`metering.upkeep.audit`).

`RollupCheck` reads what the results alone do not say (voids, reservations a cancel or a
commit settled, resets, when each limit was last defined), takes each result as the run
streams it (`RollupCheck.read`), then judges the rollup rows against the sums
(`metering.domain.audit_rollups`): a full run every row of an hour whose results retention
left whole, a ``since`` run the rows of the hours an event decided, voided or settled since
touched. An incremental run does not judge rollups: an hour's results are found by
``occurred_at``, which no index serves, so a full or ``since`` run checks them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from metering.domain.audit import Violation, WindowKey
from metering.domain.audit_rollups import Pair, RollupLedger, Settlement, judge_rollups
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.domain.limits import Limit
from metering.domain.rollups import CONSUMED, SPEND_DIMENSION, RollupKey, hour_start_us
from metering.storage.audit import RESULTS_PRUNED_BEFORE, AuditStore, SettledRow


class RollupCheck:
    """One run's rollup check: give it the resets (`reset_log`), then every
    result read (`read`), then ask for its `violations`. ``after_us``: a
    ``since`` run's instant (None: a full run)."""

    def __init__(self, store: AuditStore, limits: Mapping[str, Limit], after_us: int | None):
        self.store = store
        self.after_us = after_us
        self.dimensions = {name: limit.dimensions for name, limit in limits.items()}
        self.spend = {name for name, limit in limits.items() if limit.currency}
        self.ledger = RollupLedger(
            {name: keys for name, keys in self.dimensions.items() if keys}, store.defined_at()
        )
        self.voided = store.voided()
        self.settled = {row[0]: row for row in store.settled()}
        self.resets: dict[WindowKey, list[tuple[int, int]]] = {}
        self.touched: set[tuple[str, str, int]] = set()
        pruned_us = store.mark(RESULTS_PRUNED_BEFORE)
        self.from_us = None if pruned_us is None else pruned_us + FUTURE_TOLERANCE_US

    @property
    def metadata(self) -> bool:
        """Whether the results' metadata is needed (a limit has dimensions)."""
        return any(self.dimensions.values())

    def reset_log(self, resets: Iterable[tuple[WindowKey, int, int]]) -> None:
        """The resets of one counter each: (window, tick, reset_at_us)."""
        for key, tick, at_us in resets:
            self.resets.setdefault(key, []).append((tick, at_us))

    def read(
        self,
        event_id: str,
        outcome: str,
        decided_us: int,
        tick: int,
        charges: Sequence[Sequence[Any]],
        occurred_us: int,
        metadata: str | None,
    ) -> None:
        """One result, as the run read it (``charges`` decoded)."""
        if outcome not in CONSUMED:
            return
        voided_us = self.voided.get(event_id)
        row = self.settled.get(event_id)
        if self.after_us is not None:
            moments = (decided_us, voided_us or 0, row[2] if row else 0)
            if max(moments) > self.after_us:
                hour = hour_start_us(occurred_us)
                self.touched.update((str(c[0]), str(c[1]), hour) for c in charges)
        if voided_us is not None:
            return
        settlement = None if row is None else self._settlement(row, tick)
        meta = json.loads(metadata) if metadata else None
        self.ledger.add(outcome, occurred_us, decided_us, charges, meta, settlement)

    def _settlement(self, row: SettledRow, tick: int) -> Settlement:
        _, cancelled, settled_us, held_text, back_text = row
        held: dict[Pair, tuple[int, int, int]] = {}
        cleared = set()
        for subject, limit, cost, start, end in json.loads(held_text):
            pair = (str(subject), str(limit))
            held[pair] = (int(cost), int(start), int(end))
            resets = self.resets.get((pair[0], pair[1], int(start)), ())
            if any(t > tick and at_us < settled_us for t, at_us in resets):
                cleared.add(pair)
        back = {
            (str(s), str(lim)): int(units) for s, lim, _, units in json.loads(back_text or "[]")
        }
        spend = frozenset(pair for pair in held if pair[1] in self.spend)
        return Settlement(cancelled, settled_us, held, back, frozenset(cleared), spend)

    def violations(self) -> list[Violation]:
        """The judged rollup rows that differ from the ledger's sums."""
        found = self.store.rollups(self.from_us)
        return judge_rollups(self.ledger.rows, found, self._judged)

    def _judged(self, key: RollupKey) -> bool:
        subject, limit, dimension, hour, _ = key
        if self.from_us is not None and hour < self.from_us:
            return False
        if self.after_us is not None and (subject, limit, hour) not in self.touched:
            return False
        spend = dimension == SPEND_DIMENSION
        if not spend and dimension not in self.dimensions.get(limit, ()):
            return False  # its limit's keys now are others (or it is gone)
        return (subject, limit, hour, spend) not in self.ledger.unknown
