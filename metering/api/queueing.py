"""Getting validated events to the workers, or deciding them at once.

`enqueue` publishes a request's events at once, one message per queue
(`ApiProducer.publish`), so the 202 that follows means the broker has
them; while the broker is away they are kept by the producer and sent when
it is back (`Kept`). `apply_now` is
``?wait=decision``: one event goes through `Meter.aconsume` (group commit
with every other request of this process), several through `Meter.apply`
in one transaction, in order. Both answer a repeated id like `consume`
does: its stored result marked ``duplicate``, or a 409 when its charges
differ. For a key that may only ingest, `apply_now` first checks each new
event (`denied_when_checked`): one denied then is answered with that denial
and never applied, so a probe records nothing and notifies nobody.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import islice
from typing import Final

from starlette.concurrency import run_in_threadpool

from metering.api.parsing import CHARGE_FIELDS, MAX_ERRORS, Parsed, QueuedEvent
from metering.api.problems import ApiProblem
from metering.domain.decisions import Decision
from metering.domain.distinct import value_of
from metering.domain.events import UsageEvent, refuse_free
from metering.domain.instants import from_us
from metering.domain.limits import Limit
from metering.errors import (
    BrokerUnavailable,
    EventConflict,
    InvalidInput,
    OccurredAtOutOfRange,
    UnknownLimit,
)
from metering.meter import Meter
from metering.pipeline.producer import Item, UsageProducer
from metering.pipeline.routing import queue_for
from metering.usage.results import StoredResult, stored_results


def conflicts_among(events: Sequence[UsageEvent], stored: Mapping[str, StoredResult]) -> list[str]:
    """Ids among ``events`` stored with other charges."""
    return [
        e.event_id
        for e in events
        if e.event_id in stored and stored[e.event_id].fingerprint != e.fingerprint()
    ]


def queued_conflicts(
    events: Sequence[QueuedEvent], stored: Mapping[str, StoredResult]
) -> list[str]:
    """`conflicts_among` for the queued path's events."""
    return [
        e.event_id
        for e in events
        if e.event_id in stored and stored[e.event_id].fingerprint != e.fingerprint
    ]


def conflict(ids: Sequence[str], *, applied: bool, within: bool = False) -> ApiProblem:
    where = "in this request" if within else "before"
    rest = (
        "the other events were applied: GET /v1/events/{id} has their results"
        if applied
        else "nothing was accepted"
    )
    detail = f"{len(ids)} event id(s) used {where} with other charges ({ids[0]!r}...); {rest}"
    return ApiProblem("conflict", detail, extra={"event_ids": list(ids)})


def unique_events(parsed: Sequence[Parsed]) -> list[UsageEvent]:
    """The first event of each id; an id repeated with other charges is a 409."""
    first: dict[str, UsageEvent] = {}
    conflicting: list[str] = []
    for item in parsed:
        event = item.event
        seen = first.setdefault(event.event_id, event)
        # An event is its own first: no fingerprint is computed for unique ids.
        if (
            seen is not event
            and seen.fingerprint() != event.fingerprint()
            and event.event_id not in conflicting
        ):
            conflicting.append(event.event_id)
    if conflicting:
        raise conflict(conflicting, applied=False, within=True)
    return list(first.values())


def unique_queued(events: Sequence[QueuedEvent]) -> list[QueuedEvent]:
    """`unique_events` for the queued path's events."""
    first: dict[str, QueuedEvent] = {}
    conflicting: list[str] = []
    for event in events:
        seen = first.setdefault(event.event_id, event)
        if (
            seen is not event
            and seen.fingerprint != event.fingerprint
            and event.event_id not in conflicting
        ):
            conflicting.append(event.event_id)
    if conflicting:
        raise conflict(conflicting, applied=False, within=True)
    return list(first.values())


class ApiProducer(UsageProducer):
    """The API process's producer: it publishes each request's events at
    once, from the request's thread, as the message text the API wrote
    while validating them (`parsing.QueuedEvent`): no buffer, lock or
    encoding on the way. It buffers only what the broker did not take:
    those events are kept, and sent by the producer's thread (in order,
    before any newer event) once the broker is back."""

    def publish(self, events: Sequence[QueuedEvent]) -> None:
        """Send ``events`` now: one message per queue (of at most
        ``batch_size`` events); `BrokerUnavailable` naming the kept events
        when the broker does not take them after the producer's retries."""
        self._after_fork_check()
        queues = self.queues
        by_queue: dict[str, list[Item]] = {}
        for e in events:
            by_queue.setdefault(queue_for(e.charges[0].subject, queues), []).append(
                (e.event_id, e.text)
            )
        if self._closed or any(self._buffers.values()):
            # Kept events go first: through the buffer, in order.
            self._emit_items(by_queue)
            self.flush()
            return
        size = self.batch_size
        chunks = [
            (queue, items[start : start + size])
            for queue, items in by_queue.items()
            for start in range(0, len(items), size)
        ]
        for index, (queue, chunk) in enumerate(chunks):
            try:
                self._send(queue, chunk)
            except BrokerUnavailable as exc:
                # This chunk and the ones after it are kept, as `flush` keeps them.
                unsent: dict[str, list[Item]] = {}
                for later, items in chunks[index:]:
                    unsent.setdefault(later, []).extend(items)
                self._emit_items(unsent)
                raise BrokerUnavailable(exc.reason, self.kept) from exc.__cause__

    def _emit_items(self, by_queue: Mapping[str, Sequence[Item]]) -> None:
        """Buffer ``by_queue``'s events under one hold of the lock: the same
        buffers, bound and flushes as `UsageProducer._add` (`UsageProducer._buffer`)."""
        items = [(queue, item) for queue, queued in by_queue.items() for item in queued]
        self._after_fork_check()
        waiting = False  # an event stays buffered: the flushing thread must run
        self._lock.acquire()
        try:
            pending = self.pending
            for queue, item in items:
                if self._buffer(queue, item, pending):
                    self._flush_queue(queue)
                    pending = self.pending
                else:
                    pending += 1
                    waiting = True
        finally:
            self._lock.release()
            if waiting:
                self._ensure_thread()

    def shut_down(self) -> list[str]:
        """Close at the server's shutdown: one last flush of what is kept (with
        the producer's retries), then the ids still not sent, which this
        process drops (it ends: nothing would send them)."""
        try:
            self.close()
        except BrokerUnavailable:
            unsent = self.discard()
            self.close()  # nothing left to send: it only stops
            return unsent
        return []


def enqueue(producer: UsageProducer, events: Sequence[QueuedEvent]) -> None:
    """Queue ``events``: on return the broker has them (runs in a thread)."""
    ids = [event.event_id for event in events]
    try:
        if isinstance(producer, ApiProducer):
            producer.publish(events)
        else:  # a producer given to `create_api`
            for event in events:
                producer.emit(
                    charges=event.charges,
                    event_id=event.event_id,
                    occurred_at=from_us(event.occurred_at_us),
                    metadata=event.metadata,
                )
            producer.flush()
    except BrokerUnavailable as exc:
        mine = set(ids)
        kept = [event_id for event_id in producer.kept if event_id in mine]
        raise ApiProblem(
            "broker-unavailable",
            f"{exc.reason}; {len(kept)} of {len(ids)} events are kept and will be queued "
            "when the broker is back (send them again only under the same ids)",
            extra={"event_ids": ids, "kept": kept},
            headers={"retry-after": "5"},
        ) from exc


class UnknownLimits(Exception):
    """Events not decided before charge limits that do not exist (``limits``):
    the request is refused (`unknown_limits`), nothing queued."""

    def __init__(self, limits: Sequence[str]) -> None:
        super().__init__(", ".join(limits))
        self.limits = list(limits)


def accept(
    meter: Meter, producer: UsageProducer, events: Sequence[QueuedEvent]
) -> tuple[list[QueuedEvent], dict[str, StoredResult]]:
    """The queued path, in one thread: look the ids up in the ledger (a
    conflict refuses all), check the limits of those not decided before
    (`UnknownLimits` refuses all: a worker would only reject them), queue them.
    Returns the events queued and the stored results of the others."""
    stored = stored_results(meter.database, [event.event_id for event in events])
    conflicting = queued_conflicts(events, stored)
    if conflicting:
        raise conflict(conflicting, applied=False)
    fresh = [event for event in events if event.event_id not in stored]
    if fresh:
        unknown = meter.unknown_limits(c.limit for event in fresh for c in event.charges)
        if unknown:
            raise UnknownLimits(unknown)
        _refuse_free(meter, fresh)
        enqueue(producer, fresh)
    return fresh, stored


def _refuse_free(meter: Meter, events: Sequence[QueuedEvent | UsageEvent]) -> None:
    """A cost of 0 is refused at ingest on a limit that is no gauge (a worker
    would only reject it): `FreeCharge` for the first such charge."""
    limits = {c.limit for event in events for c in event.charges if c.cost == 0}
    for name in sorted(limits):
        error = refuse_free(meter.get_limit(name), 0)
        if error is not None:
            raise FreeCharge(name, error)


class FreeCharge(Exception):
    """A charge of cost 0 on ``limit``, which is no gauge: ``error`` says why."""

    def __init__(self, limit: str, error: InvalidInput) -> None:
        super().__init__(limit, error)
        self.limit = limit
        self.error = error


def free_charge(parsed: Sequence[Parsed], refused: FreeCharge) -> ApiProblem:
    """The 400 naming each charge of cost 0 on the refused limit; nothing queued."""
    errors = [
        (item.charge_pointer(index, "cost"), refused.error.message)
        for item in parsed
        for index, charge in enumerate(item.event.charges)
        if charge.limit == refused.limit and charge.cost == 0
    ][:MAX_ERRORS]
    return ApiProblem("invalid-input", f"{errors[0][0]}: {errors[0][1]}", errors)


def refused_charges(meter: Meter, parsed: Sequence[Parsed], error: InvalidInput) -> ApiProblem:
    """The 400 of what deciding ``parsed`` refused: each charge at fault (a
    cost of 0 on a limit that is no gauge, a seat limit's cost or metadata)
    named as the body gave it (``events[1].cost``, ``charges[0].cost``,
    ``metadata``); else the field of ``error`` in the one event, or as the
    library names it."""
    limits = {}
    for name in sorted({c.limit for item in parsed for c in item.event.charges}):
        try:
            limits[name] = meter.get_limit(name)
        except UnknownLimit:
            continue
    errors: list[tuple[str, str]] = []
    for item in parsed:
        for index, charge in enumerate(item.event.charges):
            limit = limits.get(charge.limit)
            found = None if limit is None else charge_error(limit, charge.cost, item.event)
            if found is None or found.field != error.field:
                continue
            if found.field == "cost":
                errors.append((item.charge_pointer(index, "cost"), found.message))
            elif (item.field_pointer(found.field), found.message) not in errors:
                errors.append((item.field_pointer(found.field), found.message))
    errors = errors[:MAX_ERRORS] or [(_pointer(parsed, error.field), error.message)]
    return ApiProblem("invalid-input", f"{errors[0][0]}: {errors[0][1]}", errors)


def _pointer(parsed: Sequence[Parsed], field: str) -> str:
    """The library's ``field`` in the one event (of one charge, for a
    charge's field); as the library names it when that is ambiguous."""
    if len(parsed) != 1:
        return field
    item = parsed[0]
    if field not in CHARGE_FIELDS:
        return item.field_pointer(field)
    return item.charge_pointer(0, field) if len(item.event.charges) == 1 else field


def charge_error(limit: Limit, cost: int, event: UsageEvent) -> InvalidInput | None:
    """Why deciding a charge of ``cost`` on ``limit`` in ``event`` is refused, if it is."""
    free = refuse_free(limit, cost)
    if free is not None or limit.distinct is None:
        return free
    try:
        value_of(limit.distinct, limit.name, event.metadata, cost)
    except InvalidInput as exc:
        return exc
    return None


def denied_when_checked(meter: Meter, events: Sequence[UsageEvent]) -> dict[str, Decision]:
    """Of ``events`` not decided before, those a check (`Meter.check`, which
    writes nothing) denies now, each with that denial under its own id. An
    event that fits when checked is left to be applied: if another request
    takes the room first, its denial is recorded as any other."""
    stored = stored_results(meter.database, [event.event_id for event in events])
    denied: dict[str, Decision] = {}
    for event in events:
        if event.event_id in stored:
            continue  # a duplicate or a conflict: answered as `consume` answers it
        checked = meter.check(
            charges=event.charges, occurred_at=event.occurred_at, metadata=event.metadata
        )
        if not checked.allowed:
            denied[event.event_id] = replace(checked, event_id=event.event_id)
    return denied


async def apply_now(
    meter: Meter, parsed: Sequence[Parsed], *, record_denials: bool = True
) -> list[Decision]:
    """``?wait=decision``: decide every event now; results in the order sent.
    Without ``record_denials`` (a key that may only ingest), an event denied
    when checked is answered so and not applied (`denied_when_checked`)."""
    unique = unique_events(parsed)
    try:
        by_id = (
            {} if record_denials else await run_in_threadpool(denied_when_checked, meter, unique)
        )
        rest = [event for event in unique if event.event_id not in by_id]
        if len(rest) == 1:
            event = rest[0]
            by_id[event.event_id] = await meter.aconsume(
                charges=event.charges,
                event_id=event.event_id,
                occurred_at=event.occurred_at,
                metadata=event.metadata,
            )
        elif rest:
            by_id.update(await run_in_threadpool(_apply_batch, meter, rest))
    except UnknownLimit as exc:
        raise unknown_limits(parsed, [exc.limit], verb="applied") from None
    except InvalidInput as exc:
        raise await run_in_threadpool(refused_charges, meter, parsed, exc) from None
    except OccurredAtOutOfRange as exc:
        raise _out_of_range(parsed, exc) from None
    return [by_id[item.event.event_id] for item in parsed]


def _apply_batch(meter: Meter, events: Sequence[UsageEvent]) -> dict[str, Decision]:
    stored = stored_results(meter.database, [e.event_id for e in events])
    conflicting = conflicts_among(events, stored)
    if conflicting:
        raise conflict(conflicting, applied=False)
    decided = meter.apply(events, invalid="raise")
    late = [
        e.event_id for e, d in zip(events, decided, strict=True) if isinstance(d, EventConflict)
    ]
    if late:  # decided by someone else in the meantime
        raise conflict(late, applied=True)
    return {e.event_id: d for e, d in zip(events, decided, strict=True) if isinstance(d, Decision)}


# At most this many unknown limits named in one answer's detail.
MAX_NAMES: Final = 10


def unknown_limits(
    parsed: Sequence[Parsed], names: Sequence[str], *, verb: str = "queued"
) -> ApiProblem:
    """The 422 naming each charge of ``parsed`` to one of the unknown limits
    ``names`` (the first `MAX_ERRORS` charges, the first `MAX_NAMES` names);
    nothing was ``verb`` (queued, applied)."""
    unknown = set(names)
    at_fault = (
        (item.charge_pointer(index, "limit"), f"unknown limit {charge.limit!r}")
        for item in parsed
        for index, charge in enumerate(item.event.charges)
        if charge.limit in unknown
    )
    errors = list(islice(at_fault, MAX_ERRORS))
    if len(names) == 1:
        detail = str(UnknownLimit(names[0]))
    else:
        listed = ", ".join(repr(name) for name in names[:MAX_NAMES])
        if len(names) > MAX_NAMES:
            listed += f" and {len(names) - MAX_NAMES:,} more"
        detail = f"unknown limits {listed}: define them with `metering limits set`"
    return ApiProblem(
        "unknown-limit", f"{detail}; nothing was {verb}", errors or [("limit", detail)]
    )


def _out_of_range(parsed: Sequence[Parsed], error: OccurredAtOutOfRange) -> ApiProblem:
    errors = [
        (item.time_pointer, error.message)
        for item in parsed
        if item.event.occurred_at == error.occurred_at
    ]
    return ApiProblem("invalid-input", str(error), errors or [("occurred_at", error.message)])
