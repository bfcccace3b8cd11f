"""Retention: how long results, dead letters and webhook records are kept.

Every table that grows with traffic has an age after which its rows go:

* ``results``: the ledger of decisions, and what makes each event id count
  once. A result is never deleted while its event could still be applied
  again: not before the redelivery horizon, the longest allowed lateness of
  any limit (an older event is rejected, never charged) plus the broker's
  visibility timeout plus a day for producers still retrying. A configured
  age below that horizon is raised to it.
* ``corrections``: voided events, at the results' age, and never before the
  result they correct: while the result is there a void of its event can
  come again (a retry, with the same ``correction_id``) and must find it.
* ``counter_resets``: operators' resets, at the results' age (a void reads
  them only for events decided before them).
* ``rejected_messages``: the dead-letter record.
* webhook deliveries that are settled (delivered or failed) with their
  attempts, then messages with no delivery left, then the once-per-window
  marks of windows long over: never a mark of a window events may still
  arrive for (the redelivery horizon, which holds every limit's lateness),
  or a late event after a void would notify the same window twice.
* ``usage_rollups`` (usage by dimension, hour by hour) are kept as long as
  the results they sum: an hour goes once it is wholly older than the
  results' cut-off, so ``report usage --group-by`` and the results it could
  be checked against cover the same past.

Pruning results notes their cut-off for `metering.audit` (``audit_marks``).
Counters are not pruned: they are the usage that reports bill from; nor are
entitlements, grants and what windows drew on them, which reports read
beside the counters.
Beat runs `prune` once an hour (``metering.prune``); ``metering prune
--dry-run`` shows what would go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection

from metering.domain.bounds import validate_seconds
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.meter import Meter
from metering.settings import DAY_US
from metering.settings import RetentionPolicy as RetentionPolicy
from metering.storage.audit import RESULTS_PRUNED_BEFORE, AuditStore
from metering.storage.retention import CHUNK, RetentionStore

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
