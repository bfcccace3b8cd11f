"""One round trip for a single event on PostgreSQL (``metering_consume_one``).

The function (migration 0012's, grown up to 0045) decides the usual event by
the rules of `metering.domain.rules.decide` and writes what
`PostgresHotStore.write` would, in one autocommit statement. It declines,
writing nothing: limits changed since cached (``stale``), an id with a result
(``exists``), an event before its first-use window (``old``), a charge that
would notify or trip a breaker (``notify``), a zoned subject's counter of an older first-use
window (``zone``). `apply_one` takes a raw psycopg connection in autocommit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Final

import psycopg

from metering.storage.results import ResultRecord, _compact, _dumps

CONSUME_ONE: Final = (
    "SELECT metering_consume_one(%s::bigint, %s::text, %s::text, %s::bigint, %s::bigint,"
    " %s::text, %s::jsonb, %s::int[])"
)

# A charge as the function takes it (see migration 0012):
# (limit, subject, cost, kind "b"/"c"/"f", maximum, enforcement, token_us,
#  calendar window start, calendar window end or first-use period,
#  percent thresholds, unit thresholds, a seat limit's value or None,
#  whether the subject has grants on the limit, a priced charge's
#  (currency, amount) or None; since 0033 the billing month of a subject
#  with a time zone or None, a limit's dimensions' (key, value) pairs, a
#  paced limit's burst in units or None, a gauge's aggregation or None;
#  since 0034 a price by the window's total, or a spend charge's priced
#  charges' positions from 1, or None, and a limit's runaway breaker or None;
#  since 0042 a seat's window's stamp its value is known held at, or None).
# A price by the window's total (since 0034): currency, model, flat fee,
# tiers (end or None, micro-minor price), package, per package, per unit.
TieredPrice = tuple[
    str, str, int, tuple[tuple[int | None, int], ...], int | None, int | None, int | None
]
# A runaway breaker (since 0034): factor, floor, the quarantine maximum and
# the enforcement a quarantined subject is held to.
Breaker = tuple[int, float | None, int, str]
OneCharge = tuple[
    str,
    str,
    int,
    str,
    int,
    str,
    int,
    int,
    int,
    Sequence[int],
    Sequence[int],
    str | None,
    bool,
    tuple[str, int] | None,
    str | None,
    tuple[tuple[str, str], ...],
    int | None,
    str | None,
    TieredPrice | tuple[int, ...] | None,
    Breaker | None,
    int | None,
]
# A seat charge's position in the call (from 0) and the stamp of its
# window's held values its value was found held at (migration 0042).
HeldAt = tuple[int, int]


@dataclass(frozen=True, slots=True)
class FunctionDeclined:
    """What the function declined (``stale``, ``exists``, ``old``, ``notify``),
    or ``error``: the statement failed (a concurrent insert of the same key,
    a deadlock, a lost connection); nothing was written."""

    code: str


def call_parameters(
    version: int,
    event_id: str,
    fingerprint: str,
    at_us: int,
    now_us: int,
    metadata: Any,
    charges: Sequence[OneCharge | str],
    order: list[int] | None = None,
) -> tuple[Any, ...]:
    """The parameters of `CONSUME_ONE` for one event; ``order``, the charges'
    positions from 1 in lock order (by limit and subject), when known; a
    charge may be its text already (`plain_text`: then ``order`` is given)."""
    # Each charge with its row's first fields as the results row spells them;
    # a seat's value and those fields at cost 0 (a seat held), whether grants
    # pay past the maximum, the price its consumed row carries, and the
    # billing month of a counter it creates for a subject with a zone, and
    # the dimensions' values its consumed cost is rolled up by, a paced
    # limit's burst and a gauge's aggregation.
    encoded: list[Any] = []
    texts = False
    for found in charges:
        if isinstance(found, str):
            encoded.append(found)
            texts = True
            continue
        thresholds = bool(found[9] or found[10])
        charge = [
            *found[:9],
            _first_fields(found[1], found[0], found[2]),
            list(found[9]) if thresholds else None,
            list(found[10]) if thresholds else None,
        ]
        seat, granted, price, month, dims, burst, gauge, tiers, breaker, held_at = found[11:21]
        if (
            seat is None
            and not granted
            and price is None
            and month is None
            and not dims
            and burst is None
            and gauge is None
            and tiers is None
            and breaker is None
        ):
            encoded.append(charge)  # none of the later elements: the first twelve alone
            continue
        later: list[Any] = [month, [list(pair) for pair in dims] if dims else None, burst, gauge]
        # A price by the window's total (20), a spend charge's sum (21), a breaker (22).
        if tiers is not None:
            later += [tiers, None] if tiers and isinstance(tiers[0], str) else [None, tiers]
        else:
            later += [None, None]
        later.append(breaker)
        if seat is not None:  # with the stamp, None too: the answer says where it was held
            later.append(held_at)
        else:
            while later and later[-1] is None:
                later.pop()
        if seat is not None or granted or price is not None or later:
            held = None if seat is None else _first_fields(found[1], found[0], 0)
            charge += [seat, held, granted, None if price is None else _price_text(*price)]
            charge += later
        encoded.append(charge)
    if order is None:
        order = lock_order([(found[0], found[1]) for found in charges])
    if texts:
        array = ",".join([c if isinstance(c, str) else _compact(c) for c in encoded])
        array = f"[{array}]"
    else:
        array = _compact(encoded)
    return (
        version,
        event_id,
        fingerprint,
        at_us,
        now_us,
        _dumps(metadata) if metadata is not None else None,
        array,
        order,
    )


def lock_order(pairs: Sequence[tuple[str, str]]) -> list[int]:
    """The positions from 1 of an event's charges on ``pairs`` ((limit,
    subject)) in the order the function locks their counters."""
    if len(pairs) == 1:
        return [1]
    return [i + 1 for i in sorted(range(len(pairs)), key=pairs.__getitem__)]


# A plain charge's text (`plain_text`) but its cost, window and cost again.
PlainParts = tuple[str, str, str, str]


def plain_parts(
    limit: str,
    subject: str,
    kind: str,
    maximum: int,
    enforcement: str,
    token_us: int,
    thresholds: Sequence[int],
    thresholds_units: Sequence[int],
) -> PlainParts:
    """The parts of the text of a charge with none of the later elements (no
    seat, grants, price, zone, dimensions, pace, gauge nor breaker)."""
    head = _compact([limit, subject])[:-1]
    middle = _compact([kind, maximum, enforcement, token_us])[1:-1]
    first = encode_basestring_ascii(f"{_first_fields(subject, limit, 0)[:-1]}")[:-1]
    if thresholds or thresholds_units:
        tail = f"{_compact(list(thresholds))},{_compact(list(thresholds_units))}"
    else:
        tail = "null,null"
    return f"{head},", f",{middle},", f",{first}", f'",{tail}]'


def plain_text(parts: PlainParts, cost: int, start: int, end: int) -> str:
    """The text of the charge of ``parts`` at ``cost`` in window [``start``, ``end``)."""
    cost_text = int.__repr__(cost)
    head, middle, first, tail = parts
    return f"{head}{cost_text}{middle}{start},{end}{first}{cost_text}{tail}"


def _first_fields(subject: str, limit: str, cost: int) -> str:
    """``_compact([subject, limit, cost])`` without its brackets, without its encoder."""
    return (
        f"{encode_basestring_ascii(subject)},{encode_basestring_ascii(limit)},{int.__repr__(cost)}"
    )


def _price_text(currency: str, amount: int) -> str:
    """``_compact([currency, amount])``, without its encoder."""
    return f"[{encode_basestring_ascii(currency)},{int.__repr__(amount)}]"


def apply_one(
    raw: psycopg.Connection[Any],
    parameters: tuple[Any, ...],
    metadata: Any,
) -> tuple[ResultRecord, list[HeldAt]] | FunctionDeclined:
    """Run the function on ``raw`` (in autocommit): the new result with the
    seat charges it found held and the stamps they were held at, or `FunctionDeclined`."""
    try:
        row = raw.execute(CONSUME_ONE, parameters).fetchone()
    except psycopg.errors.UniqueViolation as exc:
        # The id has a result (or a key was created meanwhile): nothing was written.
        return FunctionDeclined("exists" if exc.diag.constraint_name == "results_pkey" else "error")
    except psycopg.Error:
        # Nothing was written (one autocommit statement); the usual path
        # retries, or raises what it finds.
        return FunctionDeclined("error")
    assert row is not None
    answer = row[0]
    if answer[0] != "ok":
        return FunctionDeclined(answer[0])
    outcome, denied_by, charges = answer[1:4]
    held: list[HeldAt] = []
    if len(answer) > 4 and answer[4]:  # (since 0042, to a call that sent the stamps)
        for pair in answer[4].split(","):
            position, stamp = pair.split(":")
            held.append((int(position) - 1, int(stamp)))
    event_id, fingerprint, at_us, now_us = parameters[1:5]
    record = ResultRecord(
        event_id,
        outcome,
        fingerprint,
        at_us,
        now_us,
        tuple(denied_by.split(",")) if denied_by else (),
        None,
        json.loads(charges),
        metadata,
    )
    return record, held
