"""Where queued work goes: the task names and the queues, in one place.

Producers publish under these names and workers register their tasks under
them (`workers.tasks`), so a name is written once. Events are routed by a
hash of their (first) subject: with one queue everything goes to
``metering``; with N, to ``metering.0`` … ``metering.N-1``. Beat's sweeps
and ``metering emit`` without a queue count always use ``metering``, so a
worker consumes it whatever else it consumes (`worker_queues`).
"""

from __future__ import annotations

import zlib
from typing import Final

DEFAULT_QUEUE: Final = "metering"
# Bounds of METERING_QUEUES and ``metering worker --queues``.
MAX_QUEUES: Final = 1024

# The header a producer stamps on each message it sends: when, in microseconds
# since the epoch (`metering status` reports the oldest still queued). Older
# messages, and the ones beat sends, have none.
SENT_AT_HEADER: Final = "metering_sent_at_us"

# Task names (explicit: a rename of a function never orphans queued messages).
APPLY_BATCH_TASK: Final = "metering.apply_batch"
SWEEP_EMBEDDED_BROKER_TASK: Final = "metering.sweep_embedded_broker"
DELIVER_WEBHOOKS_TASK: Final = "metering.deliver_webhooks"
SWEEP_WEBHOOK_RESETS_TASK: Final = "metering.sweep_webhook_resets"
SWEEP_RESERVATIONS_TASK: Final = "metering.sweep_reservations"
PRUNE_TASK: Final = "metering.prune"
COMPACT_ROLLUPS_TASK: Final = "metering.compact_rollups"
AUDIT_TASK: Final = "metering.audit"


def queue_for(subject: str, queues: int) -> str:
    """The queue of a subject: stable, so one consumer applies a subject's events in order."""
    if queues <= 1:
        return DEFAULT_QUEUE
    return f"{DEFAULT_QUEUE}.{zlib.crc32(subject.encode()) % queues}"


def queue_names(queues: int) -> list[str]:
    """The queues producers publish events to with ``queues`` hash-routed queues."""
    return [DEFAULT_QUEUE] if queues <= 1 else [f"{DEFAULT_QUEUE}.{n}" for n in range(queues)]


def worker_queues(queues: int) -> list[str]:
    """Every queue a worker must consume with ``queues`` hash-routed queues: the
    default queue first (beat's sweeps, single-queue producers), then
    ``metering.0`` … ``metering.N-1``. Give it to ``celery worker -Q`` joined by commas."""
    return list(dict.fromkeys([DEFAULT_QUEUE, *queue_names(queues)]))
