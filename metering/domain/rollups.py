"""Usage by dimension: what a batch of decisions adds to the hourly rollups (docs/reports.md).

A limit with ``dimensions`` (metadata keys such as ``route``) has its consumed usage summed
per (subject, limit, key, UTC hour of ``occurred_at``, value): cost and events. The rules
live only in `rollup_deltas`: an event counts when its outcome is in `CONSUMED` (all of its
charges; a denied event none), except a shadow charge's `WOULD_DENY`. A string value is cut
to `MAX_VALUE_CHARS`; a missing key, null or empty string is `NO_VALUE`; other JSON is its
compact text; NUL is written ``\\u0000``. Deltas carry a sign: a void subtracts what its
event added, so rollups equal the consumed, unvoided usage; a cancel takes away what it gave
back (`given_back_deltas`), and the event too when all of a charge came back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

HOUR_US: Final = 3_600_000_000
NO_VALUE: Final = ""
NO_VALUE_SHOWN: Final = "(none)"
MAX_VALUE_CHARS: Final = 200
CONSUMED: Final = frozenset({"allowed", "overage"})
WOULD_DENY: Final = "would_deny"  # a shadow limit's charge: nothing consumed

# (subject, limit, dimension key, hour start, value): the primary key's order.
RollupKey = tuple[str, str, str, int, str]
# (used, events) to add: negative to subtract.
Delta = tuple[int, int]

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode


class Decided(Protocol):
    """What `rollup_deltas` reads of a decided event (a results row)."""

    @property
    def outcome(self) -> str: ...

    @property
    def occurred_at_us(self) -> int: ...

    @property
    def charges(self) -> Sequence[Sequence[Any]]: ...  # `ChargeDecision.to_row()` lists

    @property
    def metadata(self) -> Mapping[str, Any] | None: ...


def hour_start_us(at_us: int) -> int:
    """The start of the UTC hour holding ``at_us``."""
    return at_us - at_us % HOUR_US


def dimension_value(metadata: Mapping[str, Any] | None, key: str) -> str:
    """The value recorded for ``key`` of ``metadata`` (see the module docstring)."""
    if metadata is None:
        return NO_VALUE
    value = metadata.get(key)
    if value is None:
        return NO_VALUE
    text = value if isinstance(value, str) else _compact(value)
    text = text[:MAX_VALUE_CHARS]
    return text.replace("\x00", "\\u0000") if "\x00" in text else text


def shown_value(value: str) -> str:
    """A recorded value as reports show it: `NO_VALUE` as ``(none)``."""
    return NO_VALUE_SHOWN if value == NO_VALUE else value


def rollup_deltas(
    decided: Iterable[Decided],
    dimensions: Mapping[str, Sequence[str]],
    sign: int = 1,
) -> dict[RollupKey, Delta]:
    """What ``decided`` adds to the rollups (``sign=-1``: takes away), summed
    per key, so a batch writes each rollup row once.

    ``dimensions`` maps a limit's name to its keys; limits not in it (or
    with none) record nothing.
    """
    deltas: dict[RollupKey, Delta] = {}
    if not dimensions:
        return deltas
    get = deltas.get
    for event in decided:
        if event.outcome not in CONSUMED:
            continue
        at_us = event.occurred_at_us
        hour = at_us - at_us % HOUR_US
        metadata = event.metadata
        for charge in event.charges:
            name = charge[1]
            keys = dimensions.get(name)
            if not keys or charge[4] == WOULD_DENY:
                continue
            subject, cost = charge[0], sign * charge[2]
            for key in keys:
                value = metadata.get(key) if metadata else None
                if value.__class__ is not str or len(value) > MAX_VALUE_CHARS or "\x00" in value:
                    value = dimension_value(metadata, key)  # (a short string is itself)
                rollup = (subject, name, key, hour, value)
                was = get(rollup)
                deltas[rollup] = (cost, sign) if was is None else (was[0] + cost, was[1] + sign)
    return deltas


# The rollups' "dimension" under which priced charges record their amounts:
# per (subject, priced limit, hour, currency) the minor units charged. No
# metadata key can be named so (`metering.domain.limits.DIMENSION_PATTERN`).
SPEND_DIMENSION: Final = "$spend"
# A ledger row's price ([currency, amount]) follows its grants (`ChargeDecision.to_row`).
_PRICE_AT: Final = 13


def _priced(charge: Sequence[Any]) -> bool:
    """Whether a ledger row's charge has a price (after it may come an
    overdraft, with a null price: `ChargeDecision.to_row`)."""
    return len(charge) > _PRICE_AT and charge[_PRICE_AT] is not None


def spend_deltas(decided: Iterable[Decided], sign: int = 1) -> dict[RollupKey, Delta]:
    """What the priced charges of ``decided`` add to the spend rollups (the
    amounts in minor units; ``sign=-1`` takes them away): consumed only, in
    the event's hour, by currency."""
    deltas: dict[RollupKey, Delta] = {}
    for event in decided:
        if event.outcome not in CONSUMED:
            continue
        hour: int | None = None
        for charge in event.charges:  # (`_priced`, inline: a batch's every charge)
            if len(charge) > _PRICE_AT and charge[_PRICE_AT] is not None:
                if charge[4] == WOULD_DENY:
                    continue
                if hour is None:
                    hour = hour_start_us(event.occurred_at_us)
                currency, amount = charge[_PRICE_AT]
                key = (charge[0], charge[1], SPEND_DIMENSION, hour, str(currency))
                used, events = deltas.get(key, (0, 0))
                deltas[key] = (used + sign * int(amount), events + sign)
    return deltas


def spend_given_back(
    event: Decided, returned: Iterable[tuple[str, str, int, int]]
) -> dict[RollupKey, Delta]:
    """What a cancel or a void takes from the spend rollups: the amount of
    each priced charge of ``event`` whose whole cost came back (a void's of
    0 too: a seat its value keeps)."""
    whole = {(subject, name) for subject, name, cost, back in returned if back >= cost}
    deltas: dict[RollupKey, Delta] = {}
    hour = hour_start_us(event.occurred_at_us)
    for charge in event.charges:
        if _priced(charge) and (charge[0], charge[1]) in whole:
            currency, amount = charge[_PRICE_AT]
            key = (charge[0], charge[1], SPEND_DIMENSION, hour, str(currency))
            used, events = deltas.get(key, (0, 0))
            deltas[key] = (used - int(amount), events - 1)
    return deltas


def spend_kept(
    event: Decided, kept: Iterable[tuple[str, str, str, int, int, bool]]
) -> dict[RollupKey, Delta]:
    """What a commit of fewer units than reserved changes in the spend
    rollups: per priced charge (subject, limit, currency, amount charged,
    amount kept, whether none of its units stay) the amount that went back,
    and its event when none of its units stay."""
    deltas: dict[RollupKey, Delta] = {}
    hour = hour_start_us(event.occurred_at_us)
    for subject, name, currency, charged, amount, gone in kept:
        if amount == charged and not gone:
            continue
        key = (subject, name, SPEND_DIMENSION, hour, currency)
        used, events = deltas.get(key, (0, 0))
        deltas[key] = (used + amount - charged, events - (1 if gone else 0))
    return deltas


def merged(*parts: Mapping[RollupKey, Delta]) -> dict[RollupKey, Delta]:
    """Deltas summed key by key."""
    total: dict[RollupKey, Delta] = {}
    for part in parts:
        for key, (used, events) in part.items():
            was_used, was_events = total.get(key, (0, 0))
            total[key] = (was_used + used, was_events + events)
    return total


def given_back_deltas(
    event: Decided,
    returned: Iterable[tuple[str, str, int, int]],
    dimensions: Mapping[str, Sequence[str]],
) -> dict[RollupKey, Delta]:
    """What giving back some of an ``event``'s charges takes from the
    rollups (a cancel, a commit of less, a void): for each charge (subject,
    limit, cost, units given back), the units given back, and its event when
    the whole cost came back (of no unit, for a charge of 0 a void takes
    whole: a seat its value keeps)."""
    deltas: dict[RollupKey, Delta] = {}
    hour = hour_start_us(event.occurred_at_us)
    for subject, name, cost, back in returned:
        if back <= 0 and back < cost:
            continue  # nothing came back: the event stays
        for key in dimensions.get(name, ()):
            rollup = (subject, name, key, hour, dimension_value(event.metadata, key))
            used, events = deltas.get(rollup, (0, 0))
            deltas[rollup] = (used - back, events - (1 if back >= cost else 0))
    return deltas


def charged_more_deltas(
    event: Decided,
    extra: Iterable[tuple[str, str, int]],
    dimensions: Mapping[str, Sequence[str]],
) -> dict[RollupKey, Delta]:
    """What a commit of more than was reserved adds to the rollups: for each
    charge (subject, limit, units beyond the reserved cost) of the reserving
    ``event``, those units (its event was counted when it was reserved)."""
    deltas: dict[RollupKey, Delta] = {}
    hour = hour_start_us(event.occurred_at_us)
    for subject, name, more in extra:
        if more <= 0:
            continue
        for key in dimensions.get(name, ()):
            rollup = (subject, name, key, hour, dimension_value(event.metadata, key))
            used, events = deltas.get(rollup, (0, 0))
            deltas[rollup] = (used + more, events)
    return deltas


def appended_rows(
    deltas: Mapping[RollupKey, Delta],
) -> list[tuple[str, str, str, int, str, int, int]]:
    """``deltas`` as rows (key, used, events), in no order: for an append,
    which takes no row locks."""
    return [(*key, used, events) for key, (used, events) in deltas.items()]


def rollup_rows(
    deltas: Mapping[RollupKey, Delta],
) -> list[tuple[str, str, str, int, str, int, int]]:
    """``deltas`` as rows (key, used, events), sorted by key: every writer
    takes the rows' locks in this one order, so concurrent batches never
    wait on each other in a cycle."""
    return [(*key, used, events) for key, (used, events) in sorted(deltas.items())]
