"""Retention: how long results, dead letters, rollups and webhook records are kept.

`prune` deletes (or with ``dry_run`` counts) the rows of each table in `TABLES` older than
its age in the `RetentionPolicy`, in chunks; beat runs it hourly (``metering.prune``).
Tables in `HORIZON_BOUND` are never pruned inside the redelivery horizon
(`redelivery_horizon_us`: the longest lateness of any limit, the clock tolerance, the
broker's visibility timeout and a day of producer retries), so an event delivered again, a
late event or a void still finds its result, correction, reset, rollups and marks.
Corrections, resets and rollups (appended ones folded in first: `compact`) go at the results'
age, noted for `metering.upkeep.audit`; counters, entitlements, grants never (docs/reliability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection

from metering.domain.bounds import validate_seconds
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.meter import Meter
from metering.settings import DAY_US, RetentionPolicy
from metering.storage.audit import RESULTS_PRUNED_BEFORE, AuditStore
from metering.storage.retention import CHUNK, RetentionStore
from metering.storage.rollups import compact_rollups

# How long a producer may still be retrying an event it was given.
PRODUCER_RETRY_HORIZON_US: Final = DAY_US
# The order matters: deliveries (with their attempts) before their messages.
TABLES: Final = (
    "results",
    "corrections",
    "counter_resets",
    "usage_rollups",
    "rejected_messages",
    "webhook_deliveries",
    "webhook_messages",
    "webhook_marks",
)
# Never pruned inside the redelivery horizon: what an event delivered again,
# a late event or a void of it needs.
HORIZON_BOUND: Final = (
    "results",
    "corrections",
    "counter_resets",
    "usage_rollups",
    "webhook_marks",
)


@dataclass(frozen=True, slots=True)
class TablePrune:
    table: str
    before_us: int  # rows older than this went (or would go)
    rows: int


def redelivery_horizon_us(meter: Meter, visibility_timeout_seconds: float) -> int:
    """How long a result must be kept so that its event cannot be charged twice."""
    limits = meter.list_limits()
    lateness_us = max((limit.lateness_seconds * 1_000_000 for limit in limits), default=0)
    visibility_us = round(visibility_timeout_seconds * 1_000_000)
    return lateness_us + FUTURE_TOLERANCE_US + visibility_us + PRODUCER_RETRY_HORIZON_US


def prune(
    meter: Meter,
    policy: RetentionPolicy,
    *,
    visibility_timeout_seconds: float,
    dry_run: bool = False,
    chunk: int = CHUNK,
) -> list[TablePrune]:
    """Delete (or with ``dry_run`` count) every row older than its retention."""
    validate_seconds("visibility_timeout_seconds", visibility_timeout_seconds, 30 * 86_400)
    now_us = meter.database.now_us()
    horizon_us = redelivery_horizon_us(meter, visibility_timeout_seconds)
    if not dry_run:  # the batches' appended rollups folded in first
        compact(meter)
    done = []
    for table in TABLES:
        age_us = policy.age_us(table)
        if age_us is None:
            continue
        if table in HORIZON_BOUND:
            age_us = max(age_us, horizon_us)
        before_us = now_us - age_us
        rows = _prune_table(meter, table, before_us, dry_run=dry_run, chunk=chunk)
        if table == "results" and rows and not dry_run:
            _note_results_pruned(meter, before_us)
        done.append(TablePrune(table, before_us, rows))
    return done


def compact(meter: Meter) -> int:
    """Fold the rollups the batches appended into the usage rollups, in one
    transaction (beat runs it every minute, ``metering.compact_rollups``, and
    `prune` first); how many rollup rows took them in."""
    return meter.database.run(compact_rollups)


def _note_results_pruned(meter: Meter, before_us: int) -> None:
    """Tell the audit that windows from before ``before_us`` lost results
    (a full audit leaves them alone: their counters outlive their ledger)."""
    meter.database.run(lambda c: AuditStore(c).set_mark(RESULTS_PRUNED_BEFORE, before_us))


def _prune_table(meter: Meter, table: str, before_us: int, *, dry_run: bool, chunk: int) -> int:
    def count(connection: Connection) -> int:
        return RetentionStore(connection).count(table, before_us)

    def delete_chunk(connection: Connection) -> int:
        return RetentionStore(connection).delete_chunk(table, before_us, chunk)

    if dry_run:
        return meter.database.run(count)
    rows = 0
    while True:  # a transaction per chunk: no long locks, no huge transaction
        removed = meter.database.run(delete_chunk)
        rows += removed
        if removed < chunk:
            return rows
