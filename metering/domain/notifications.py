"""Which webhook notifications a counter change causes: pure rules, no SQL, no clock.

`notices_for` turns one charge (its limit, the counter before and after, its decision) into
candidate notices (the kinds and when each fires: docs/webhooks.md). Being the *first* of
its kind is the database's part: a notice carries a `Mark` (limit, subject, window start,
kind) inserted at most once; ``usage.corrected`` has none (a void happens once per event),
``grant.low`` is marked on the grant's row, ``audit.violation`` (`metering.upkeep.audit`) has
none. `reset_due` tells the sweeper when a denied subject has a fresh window (``limit.reset``).
Token buckets have no windows: their marks use window start 0 and last one episode, until the
bucket is full again (`bucket_full_at_us`); the sweeper then deletes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Literal, get_args

from metering.domain.decisions import ChargeDecision
from metering.domain.limits import Limit
from metering.domain.state import NO_WINDOW, CounterKey, CounterState

NoticeType = Literal[
    "limit.denied",
    "limit.threshold",
    "limit.forecast",
    "limit.quarantined",
    "limit.exceeded",
    "limit.reset",
    "limit.would_deny",
    "usage.corrected",
    "grant.low",
    "audit.violation",
]
MESSAGE_TYPES: Final[tuple[str, ...]] = get_args(NoticeType)
TEST_TYPE: Final = "webhook.test"
MAX_PAYLOAD_BYTES: Final = 64 * 1024


class DeliveryStatus(StrEnum):
    """Where a delivery of a notification to an endpoint stands. Members are
    strings, equal to their values (``DeliveryStatus.PENDING == "pending"``)."""

    PENDING = "pending"  # due now or after a retry delay
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # 410, or no attempt left


# Deliveries that will not be attempted again (unless replayed).
SETTLED_STATUSES: Final = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED)


@dataclass(frozen=True, slots=True)
class Notice:
    """One candidate notification, with the mark that makes it happen once.

    ``mark`` is ``denied``, ``would_deny``, ``threshold:<percent>``,
    ``units:<amount>``, ``forecast`` or ``exceeded``.
    ``window_start_us`` and ``window_end_us`` are `NO_WINDOW` for a bucket.
    ``due_at_us`` is when the sweeper must look at the mark again (the end
    of a denied window, the instant a bucket is full), or None (never).
    """

    type: NoticeType
    mark: str
    limit: str
    subject: str
    maximum: int
    used: int
    window_start_us: int
    window_end_us: int
    resets_at_us: int
    retry_at_us: int | None
    event_id: str | None
    threshold: int | None = None
    due_at_us: int | None = None
    threshold_units: int | None = None
    # ``limit.threshold`` and ``limit.forecast``: when the maximum runs out at
    # the counter's recent rate (`metering.domain.forecast`), if before the reset.
    exhausts_at_us: int | None = None

    @property
    def is_bucket(self) -> bool:
        return self.window_end_us == NO_WINDOW


def notices_for(
    limit: Limit,
    key: CounterKey,
    before: CounterState,
    after: CounterState,
    charge: ChargeDecision,
    event_id: str | None,
) -> list[Notice]:
    """The candidate notices of one charge of one event (empty for most events)."""
    bucket = limit.algorithm == "token_bucket"
    found: list[Notice] = []
    if not charge.allowed and (bucket or before.denied_count == 0):
        due = charge.resets_at_us
        found.append(_notice("limit.denied", "denied", key, charge, event_id, due_at_us=due))
    elif charge.outcome == "would_deny" and (bucket or before.denied_count == 0):
        # A bucket's mark lasts an episode, as a denial's: the sweeper drops it once full.
        episode = _due(bucket, charge)
        found.append(
            _notice("limit.would_deny", "would_deny", key, charge, event_id, due_at_us=episode)
        )
    if after.used == before.used:
        return found  # nothing consumed: no threshold crossed
    gauge = limit.is_gauge  # a level: used before is the counter's, not used less the cost
    used_before = before.used if gauge else charge.used - charge.cost
    maximum = charge.maximum  # the subject's own, at the event
    for percent in limit.thresholds:
        if used_before * 100 < percent * maximum <= charge.used * 100:
            mark = f"threshold:{percent}"
            found.append(
                _notice(
                    "limit.threshold",
                    mark,
                    key,
                    charge,
                    event_id,
                    percent,
                    due_at_us=charge.resets_at_us if bucket else None,
                )
            )
    for units in limit.thresholds_units:
        if used_before < units <= charge.used:
            notice = _notice("limit.threshold", f"units:{units}", key, charge, event_id)
            found.append(replace(notice, threshold_units=units, due_at_us=_due(bucket, charge)))
    # Overage starts in this charge iff the part of it no grant paid covers all of it.
    own_cost = charge.cost - sum(amount for _, amount in charge.grants)
    if gauge:
        starts = charge.overage > 0 and used_before <= maximum
    else:
        starts = 0 < charge.overage <= own_cost
    if limit.enforcement == "soft" and starts:
        found.append(_notice("limit.exceeded", "exceeded", key, charge, event_id))
    elif limit.enforcement == "hard" and charge.overdraft > 0:
        # Only a commit of more than was reserved goes past a hard limit.
        found.append(_notice("limit.exceeded", "exceeded", key, charge, event_id))
    return found


def _due(bucket: bool, charge: ChargeDecision) -> int | None:
    return charge.resets_at_us if bucket else None


@dataclass(frozen=True, slots=True)
class Transition:
    """One decided event's counters just before and just after it."""

    event_id: str | None
    keys: Sequence[CounterKey]
    before: Sequence[CounterState]
    after: Sequence[CounterState]
    charges: Sequence[ChargeDecision]


def notices_of(
    limits: Mapping[str, Limit],
    transitions: Sequence[Transition],
    own: Mapping[tuple[str, str], Limit] | None = None,
) -> list[Notice]:
    """Every candidate notice of a batch, in event order. ``own``: the limits
    of (limit, subject) pairs with thresholds of their own (`metering.allowances.alerts`)."""
    found: list[Notice] = []
    for t in transitions:
        for key, before, after, charge in zip(t.keys, t.before, t.after, t.charges, strict=True):
            limit = own.get((key.limit, key.subject)) if own else None
            limit = limit or limits[key.limit]
            found.extend(notices_for(limit, key, before, after, charge, t.event_id))
    return found


def _notice(
    kind: NoticeType,
    mark: str,
    key: CounterKey,
    charge: ChargeDecision,
    event_id: str | None,
    threshold: int | None = None,
    *,
    due_at_us: int | None = None,
) -> Notice:
    return Notice(
        type=kind,
        mark=mark,
        limit=key.limit,
        subject=key.subject,
        maximum=charge.maximum,
        used=charge.used,
        window_start_us=key.window_start_us,
        window_end_us=key.window_end_us,
        resets_at_us=charge.resets_at_us,
        retry_at_us=charge.retry_at_us,
        event_id=event_id,
        threshold=threshold,
        due_at_us=due_at_us,
    )


@dataclass(frozen=True, slots=True)
class Mark:
    """A stored once-per-window mark that the sweeper looks at (``due_at_us`` passed)."""

    limit: str
    subject: str
    window_start_us: int
    window_end_us: int
    kind: str
    maximum: int
    event_id: str | None
    due_at_us: int


@dataclass(frozen=True, slots=True)
class ResetStep:
    """What the sweeper does with a due mark.

    ``reschedule_us``: look again then (a bucket that is not full yet).
    Otherwise ``notice`` (a ``limit.reset``, or None) is announced and the
    mark is deleted (``delete``: buckets) or kept without a due time (windows).
    """

    notice: Notice | None = None
    reschedule_us: int | None = None
    delete: bool = False


def bucket_full_at_us(state: CounterState | None) -> int:
    """When a bucket is full again (its exact arrival time, rounded up); 0 if it is full."""
    if state is None or state.tat_us is None:
        return 0
    return -(-(state.tat_us * state.tat_scale + state.tat_rem) // state.tat_scale)


def reset_due(mark: Mark, bucket_state: CounterState | None, now_us: int) -> ResetStep:
    """Decide a due mark: announce ``limit.reset`` for a denial whose window (or
    bucket episode) is over; a bucket still refilling is looked at again later."""
    bucket = mark.window_end_us == NO_WINDOW
    if bucket:
        full_at = bucket_full_at_us(bucket_state)
        if full_at > now_us:
            return ResetStep(reschedule_us=full_at)
    if mark.kind != "denied":
        return ResetStep(delete=bucket)
    notice = Notice(
        type="limit.reset",
        mark="reset",
        limit=mark.limit,
        subject=mark.subject,
        maximum=mark.maximum,
        used=0,
        window_start_us=mark.window_start_us,
        window_end_us=mark.window_end_us,
        resets_at_us=mark.due_at_us if not bucket else now_us,
        retry_at_us=None,
        event_id=mark.event_id,
    )
    return ResetStep(notice=notice, delete=bucket)


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    seconds, micros = divmod(us, 1_000_000)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros)
    return moment.isoformat().replace("+00:00", "Z")


def grant_low_document(row: Sequence[Any], timestamp_us: int) -> dict[str, Any]:
    """The ``grant.low`` document of a grant marked low, from its (grant id,
    subject, limit, amount, used, low_at, recurring grant id)."""
    grant_id, subject, name, amount, used, low_at, schedule_id = row
    data = {
        "grant_id": grant_id,
        "subject": subject,
        "limit": name,
        "amount": amount,
        "used": used,
        "left": amount - used,
        "low_at": low_at,
        "recurring_grant_id": schedule_id,
    }
    return {"type": "grant.low", "timestamp": _iso(timestamp_us), "data": data}


def payload_of(notice: Notice, timestamp_us: int) -> dict[str, Any]:
    """The JSON document a receiver gets (Standard Webhooks shape: type, timestamp, data).

    For ``limit.reset`` the window is the one that ended, ``used`` is 0 (the
    fresh window) and ``event_id`` the denied event that started it.
    """
    windowed = not notice.is_bucket
    return {
        "type": notice.type,
        "timestamp": _iso(timestamp_us),
        "data": {
            "subject": notice.subject,
            "limit": notice.limit,
            "maximum": notice.maximum,
            "used": notice.used,
            "threshold": notice.threshold,
            "threshold_units": notice.threshold_units,
            "window_start": _iso(notice.window_start_us) if windowed else None,
            "window_end": _iso(notice.window_end_us) if windowed else None,
            "resets_at": _iso(notice.resets_at_us),
            "retry_at": _iso(notice.retry_at_us),
            "event_id": notice.event_id,
            **(
                {"exhausts_at": _iso(notice.exhausts_at_us)}
                if notice.type in ("limit.threshold", "limit.forecast")
                else {}
            ),
        },
    }
