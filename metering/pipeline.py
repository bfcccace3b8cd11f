"""The queued path: the message format, and applying one message's batch.

A message is one JSON object, the only argument of the task
``metering.apply_batch``::

    {"v": 1, "events": [{"id": "…", "charges": [["org-42", "api_calls", 3]],
                         "at": 1795000000000000, "meta": {…} | null}, …]}

``at`` is ``occurred_at`` in microseconds since the epoch. `apply_batch` is
what the worker's task calls: it validates each event again (a queue is
untrusted input), applies the valid ones in one transaction with the rules of
`Meter.consume`, stores unknown limits and out-of-range times as ``rejected``
results, and keeps input that cannot become an event at all in
``rejected_messages`` with its error. Applying is idempotent, so the task can
be delivered any number of times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metering.domain.events import UsageEvent, make_event
from metering.domain.instants import from_us
from metering.errors import EventConflict, MeteringError
from metering.meter import Meter

TASK_NAME: Final = "metering.apply_batch"
FORMAT_VERSION: Final = 1
DEFAULT_QUEUE: Final = "metering"


def encode_event(event: UsageEvent) -> dict[str, Any]:
    return {
        "id": event.event_id,
        "charges": [list(charge) for charge in event.charges],
        "at": event.occurred_at_us,
        "meta": dict(event.metadata) if event.metadata is not None else None,
    }


def encode_batch(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"v": FORMAT_VERSION, "events": list(events)}


@dataclass(frozen=True, slots=True)
class Rejected:
    """Input that could not become an event: its id when it had a usable one."""

    event_id: str | None
    reason: str
    raw: str


def decode_batch(payload: object) -> tuple[list[UsageEvent], list[Rejected]]:
    """The events of a message, and what could not be decoded, in order."""
    if not isinstance(payload, Mapping) or payload.get("v") != FORMAT_VERSION:
        return [], [Rejected(None, "not a metering batch (version 1)", _raw(payload))]
    items = payload.get("events")
    if not isinstance(items, list):
        return [], [Rejected(None, "batch has no list of events", _raw(payload))]
    events: list[UsageEvent] = []
    rejected: list[Rejected] = []
    for item in items:
        try:
            events.append(_decode_event(item))
        except (MeteringError, TypeError, ValueError, OverflowError, KeyError) as exc:
            event_id = item.get("id") if isinstance(item, Mapping) else None
            usable = event_id if isinstance(event_id, str) and len(event_id) <= 128 else None
            rejected.append(Rejected(usable, f"malformed event: {exc}", _raw(item)))
    return events, rejected


def _decode_event(item: object) -> UsageEvent:
    if not isinstance(item, Mapping):
        raise ValueError("an event must be a JSON object")
    at = item["at"]
    if isinstance(at, bool) or not isinstance(at, int):
        raise ValueError(f"'at' must be microseconds since the epoch, got {at!r}")
    return make_event(item["charges"], from_us(at), item["id"], item.get("meta"))


def _raw(value: object) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), default=repr)[:65_536]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:65_536]


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What applying one message did, for logs and the task's return value."""

    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    rejected: int = 0
    malformed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "applied": self.applied,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "rejected": self.rejected,
            "malformed": self.malformed,
        }


def apply_batch(meter: Meter, payload: object) -> BatchReport:
    """Apply one queued message; database errors propagate so the task retries."""
    events, malformed = decode_batch(payload)
    rows = [(m.event_id, m.reason, m.raw) for m in malformed]
    applied = meter.apply(events, invalid="reject", rejected=rows)
    decisions = [a for a in applied if not isinstance(a, EventConflict)]
    return BatchReport(
        applied=sum(1 for d in decisions if not d.duplicate and d.outcome != "rejected"),
        duplicates=sum(1 for d in decisions if d.duplicate),
        conflicts=len(applied) - len(decisions),
        rejected=sum(1 for d in decisions if not d.duplicate and d.outcome == "rejected"),
        malformed=len(malformed),
    )
