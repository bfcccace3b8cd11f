"""The `rollup_ledger` check of a full or ``since`` audit run (`metering.upkeep.audit`).

`RollupCheck` reads what the results alone do not say (voids, reservations a cancel or a
commit settled, each limit's dimension history), takes each result as the run streams it
(`RollupCheck.read`), then judges the rollup rows against the sums
(`metering.domain.audit_rollups`; a row they cannot say, only its sign): a full run every
row of an hour whose results retention left whole, a ``since`` run those of the hours an
event decided, voided or settled since touched. An incremental run judges none: an hour's
results are found by ``occurred_at``, which no index serves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from metering.domain.audit import Violation
from metering.domain.audit_rollups import RollupLedger, Settlement, judge_rollups
from metering.domain.dimension_history import Era, ever_seats
from metering.domain.limits import Limit
from metering.domain.rollups import CONSUMED, SPEND_DIMENSION, RollupKey, hour_start_us
from metering.storage.audit import AuditStore, SettledRow


class RollupCheck:
    """One run's rollup check: give it every result read (`read`), then ask
    for its `violations`. ``history``: every limit's dimension history;
    ``after_us``: a ``since`` run's instant (None: a full run)."""

    def __init__(
        self,
        store: AuditStore,
        limits: Mapping[str, Limit],
        history: Mapping[str, Sequence[Era]],
        after_us: int | None,
    ):
        self.store = store
        self.after_us = after_us
        # A seat limit now, or in some era of its ``history`` (deleted, or made plain, since).
        seats = {name for name, limit in limits.items() if limit.distinct}
        seats.update(name for name, eras in history.items() if ever_seats(eras))
        self.ledger = RollupLedger(history, frozenset(seats))
        self.voided = store.voided()
        self.settled = {row[0]: row for row in store.settled()}
        self.touched: set[tuple[str, str, int]] = set()
        self.from_us = store.whole_from_us()

    @property
    def metadata(self) -> bool:
        """Whether the results' metadata is needed (a limit has had dimensions)."""
        return bool(self.ledger.history)

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
        """One result, as the run read it (``charges`` decoded; ``tick``: its reset tick)."""
        if outcome not in CONSUMED or not self.ledger.counts(charges):
            return
        voided_us = self.voided.get(event_id)
        row = self.settled.get(event_id)
        if self.after_us is not None:
            moments = (decided_us, voided_us or 0, row[3] if row else 0)
            if max(moments) > self.after_us:
                hour = hour_start_us(occurred_us)
                self.touched.update((str(c[0]), str(c[1]), hour) for c in charges)
        if voided_us is not None:
            self.ledger.voided(occurred_us, decided_us, tick, charges)
            return
        settlement = None if row is None else self._settlement(row)
        meta = json.loads(metadata) if metadata else None
        self.ledger.add(outcome, occurred_us, decided_us, tick, charges, meta, settlement)

    @staticmethod
    def _settlement(row: SettledRow) -> Settlement:
        held = {(str(s), str(lim)): int(cost) for s, lim, cost, *_ in json.loads(row[1])}
        back = {(str(s), str(lim)): int(units) for s, lim, _, units in json.loads(row[2] or "[]")}
        return Settlement(held, back)

    def violations(self) -> list[Violation]:
        """The judged rollup rows that differ from the ledger's sums."""
        found = self.store.rollups(self.from_us)
        return judge_rollups(self.ledger.rows, found, self._judged, self._read, self._counted)

    def _read(self, key: RollupKey) -> bool:
        """Whether the run read the ledger of ``key``'s hour (retention kept it; touched since)."""
        subject, limit, _, hour, _ = key
        if self.from_us is not None and hour < self.from_us:
            return False
        return self.after_us is None or (subject, limit, hour) in self.touched

    def _judged(self, key: RollupKey) -> bool:
        subject, limit, dimension, hour, _ = key
        if dimension == SPEND_DIMENSION:
            return True  # money follows no seat
        return (subject, limit, hour) not in self.ledger.unknown and self._said(key)

    def _counted(self, key: RollupKey) -> bool:
        """A seat limit's usage row of an hour with a voided event: its events alone."""
        subject, limit, _, hour, _ = key
        return (subject, limit, hour) in self.ledger.unknown and self._said(key)

    def _said(self, key: RollupKey) -> bool:
        """Whether the ledger says ``key``'s row (`RollupLedger`)."""
        subject, limit, dimension, hour, _ = key
        if dimension == SPEND_DIMENSION:
            return True
        if limit not in self.ledger.history:
            return False  # no era of its limit's history has dimensions (or none is kept)
        return (subject, limit, hour) not in self.ledger.stale
