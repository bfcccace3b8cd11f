"""The one-trip function's call (`metering/storage/hot/one_trip.py`) on
PostgreSQL: `apply_one` answers the new result as the results row spells
it, and declines, writing nothing, a repeated id (``exists``), limits
changed since they were cached (``stale``), a charge that would notify
(``notify``) and a statement that fails (``error``); a held seat's row is
neither locked nor written, nor read when the call knows its window's stamp."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select, text

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.engine.one_trip import prepare
from metering.storage.hot.one_trip import (
    FunctionDeclined,
    apply_one,
    call_parameters,
    plain_parts,
    plain_text,
)
from metering.storage.results import ResultRecord, _compact
from metering.storage.tables import breakers, counters, results

NOW = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def meter(pg_url: str) -> Iterator[Meter]:
    with Meter(pg_url, clock=FrozenClock(NOW)) as meter:
        meter.set_limits(
            [
                Limit("calls", maximum=3, period="1h", window="calendar"),
                Limit("noisy", maximum=10, period="1h", window="calendar", thresholds=(50,)),
            ]
        )
        meter.consume("org-0", "calls")  # caches the limits
        yield meter


def _parameters(meter: Meter, charges: list[Any], event_id: str = "e-1") -> tuple[Any, ...]:
    record = make_event(charges, NOW, event_id, {"k": "v"}).record()
    parameters = prepare(meter._engine.limits, record, meter.database.now_us())
    assert isinstance(parameters, tuple)
    return parameters


def _apply(meter: Meter, parameters: tuple[Any, ...]) -> ResultRecord | FunctionDeclined:
    with meter._engine.direct.autocommit() as raw:  # type: ignore[union-attr]
        found = apply_one(raw, parameters, {"k": "v"})
    return found if isinstance(found, FunctionDeclined) else found[0]


def _stored(meter: Meter) -> tuple[int, int]:
    with meter.sql_engine.connect() as connection:
        rows = connection.execute(select(func.count()).select_from(results)).scalar_one()
        used = connection.execute(select(func.sum(counters.c.used))).scalar_one()
    return int(rows), int(used)


def test_the_function_answers_the_result_it_wrote(meter: Meter) -> None:
    parameters = _parameters(meter, [("org", "calls", 2)])
    found = _apply(meter, parameters)
    assert isinstance(found, ResultRecord)
    assert (found.event_id, found.outcome, found.fingerprint) == ("e-1", "allowed", parameters[2])
    assert (found.occurred_at_us, found.decided_at_us) == parameters[3:5]
    assert (found.denied_by, found.metadata) == ((), {"k": "v"})
    assert [(c[0], c[1], c[2]) for c in found.charges] == [("org", "calls", 2)]
    stored = meter.result("e-1")
    assert stored is not None and stored.outcome == "allowed"
    assert [c.used for c in meter.counters("org", "calls")] == [2]


def test_a_repeated_id_and_stale_limits_are_declined_and_write_nothing(meter: Meter) -> None:
    parameters = _parameters(meter, [("org", "calls", 1)])
    assert isinstance(_apply(meter, parameters), ResultRecord)
    before = _stored(meter)
    assert _apply(meter, parameters) == FunctionDeclined("exists")
    stale = (parameters[0] - 1, "e-2", *parameters[2:])
    assert _apply(meter, stale) == FunctionDeclined("stale")
    assert _stored(meter) == before


def test_a_charge_that_would_notify_is_declined(meter: Meter) -> None:
    assert isinstance(_apply(meter, _parameters(meter, [("org", "noisy", 4)])), ResultRecord)
    before = _stored(meter)
    crossing = _parameters(meter, [("org", "noisy", 2)], "e-2")  # 6 of 10: past 50%
    assert _apply(meter, crossing) == FunctionDeclined("notify")
    denied = _parameters(meter, [("org", "calls", 4)], "e-3")  # a denial announces itself
    assert _apply(meter, denied) == FunctionDeclined("notify")
    assert _stored(meter) == before


def _seat_row(meter: Meter) -> tuple[str, str, int]:
    """The seat row's version, its locker's id (0: never locked) and live events."""
    with meter.sql_engine.connect() as connection:
        query = text("SELECT xmin::text, xmax::text, live_events FROM distinct_values")
        [(xmin, xmax, live)] = connection.execute(query).all()
    return str(xmin), str(xmax), int(live)


def test_a_held_seat_is_not_locked_nor_read_at_the_stamp_it_is_known_held_at(
    meter: Meter,
) -> None:
    meter.set_limit(Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"))
    ann = {"user": "ann"}
    assert meter.consume("org", "seats", metadata=ann).charges[0].cost == 1  # the seat taken
    taken = _seat_row(meter)
    assert taken[1:] == ("0", 1)
    assert meter.consume("org", "seats", metadata=ann).charges[0].cost == 0  # read: held
    assert _seat_row(meter) == taken  # not upserted: no lock, no new version
    # Its row changed behind the triggers' back, the stamp standing: the
    # function, told ann is held at that stamp, takes it so without reading.
    with meter.sql_engine.begin() as connection:
        connection.execute(text("SET LOCAL session_replication_role = replica"))
        connection.execute(text("UPDATE distinct_values SET live_events = 0"))
    assert meter.consume("org", "seats", metadata=ann).charges[0].cost == 0
    assert _seat_row(meter)[2] == 0
    with meter.sql_engine.connect() as connection:  # a seat's charge has no breaker (22)
        assert connection.execute(select(func.count()).select_from(breakers)).scalar() == 0


def test_a_failed_statement_is_an_error_that_wrote_nothing(meter: Meter) -> None:
    before = _stored(meter)
    broken = (*_parameters(meter, [("org", "calls", 1)])[:6], "not json", [1])
    assert _apply(meter, broken) == FunctionDeclined("error")
    assert _stored(meter) == before


def test_charges_are_passed_in_lock_order_with_thresholds_only_where_set() -> None:
    found = call_parameters(
        7,
        "e-1",
        "fp",
        10,
        11,
        None,
        [
            (
                "b",
                "org",
                1,
                "c",
                5,
                "hard",
                1,
                0,
                9,
                (),
                (),
                None,
                False,
                None,
                None,
                (),
                None,
                None,
                None,
                None,
                None,
            ),
            (
                "a",
                "org",
                2,
                "f",
                5,
                "soft",
                1,
                0,
                9,
                (50,),
                (),
                None,
                False,
                None,
                None,
                (),
                None,
                None,
                None,
                None,
                None,
            ),
        ],
    )
    assert found[:6] == (7, "e-1", "fp", 10, 11, None)
    assert found[7] == [2, 1]
    assert found[6] == (
        '[["b","org",1,"c",5,"hard",1,0,9,"\\"org\\",\\"b\\",1",null,null],'
        '["a","org",2,"f",5,"soft",1,0,9,"\\"org\\",\\"a\\",2",[50],[]]]'
    )


def test_a_zone_dimensions_a_pace_and_a_gauge_ride_after_the_grants_and_price() -> None:
    """The optional elements after a charge's price, trailing ones left out;
    then a price by the window's total (20) or a spend charge's sum (21), a breaker (22);
    a seat's charge carries them all, and the stamp its value is known held at (23)."""
    charge = ("g", "org", 3, "c", 5, "hard", 1, 0, 9, (), (), None, False, None)
    zoned = (*charge, "2026-11", (("route", "r1"),), 2, "max", None, None, None)
    paced = (*charge, None, (), 2, None, None, None, None)
    tiers = ("USD", "graduated", 5, ((3, 10_000), (None, 4_000)), None, None, None)
    tiered = (*charge[:13], ("USD", 7), None, (), None, None, tiers, None, None)
    spent = (*charge, None, (), None, None, (1, 3), None, None)
    held = (*charge, None, (), None, None, None, (10, 0.5, 2, "hard"), None)
    seat = (*charge[:11], "ann", *charge[12:], None, (), None, None, None, None, -5)
    calls = [zoned, paced, tiered, spent, held, seat]
    found = call_parameters(7, "e-1", "fp", 10, 11, None, calls)
    head = ["g", "org", 3, "c", 5, "hard", 1, 0, 9, '"org","g",3', None, None]
    price = ["USD", "graduated", 5, [[3, 10_000], [None, 4_000]], None, None, None]
    assert json.loads(found[6]) == [
        [*head, None, None, False, None, "2026-11", [["route", "r1"]], 2, "max"],
        [*head, None, None, False, None, None, None, 2],
        [*head, None, None, False, '["USD",7]', None, None, None, None, price],
        [*head, None, None, False, None, None, None, None, None, None, [1, 3]],
        [*head, None, None, False, None, *[None] * 6, [10, 0.5, 2, "hard"]],
        # A seat's every element, to the stamp it is known held at (23).
        [*head, "ann", '"org","g",0', False, None, *[None] * 7, -5],
    ]


def test_first_fields_price_and_metadata_are_spelt_as_the_results_row_spells_them() -> None:
    subject = 'ö "org"\\'
    charge = ("g", subject, 3, "c", 5, "hard", 1, 0, 9, (), (), None, True, ("USD", 7))
    metadata = {"ü": ["x", 1.5, None]}
    found = call_parameters(7, "e-1", "fp", 10, 11, metadata, [(*charge, *[None] * 7)])
    [row] = json.loads(found[6])
    assert row[9] == _compact([subject, "g", 3])[1:-1] and row[15] == _compact(["USD", 7])
    assert found[5] == json.dumps(metadata) and found[7] == [1]


@pytest.mark.parametrize(
    ("subject", "thresholds"), [("org", ((), ())), ('o"rg\\é', ((50, 80), ())), ("x", ((), (3,)))]
)
def test_a_plain_charges_text_is_its_encoding(
    subject: str, thresholds: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    charge = ("cal", subject, 7, "c", 6, "hard", 5, 100, 200, *thresholds, *[None] * 10)
    charge = (*charge[:12], False, *charge[13:])
    other = ("fu", "org", 1, "f", 4, "soft", 0, 0, 9, (), (), "v", False, *[None] * 8)
    parts = plain_parts("cal", subject, "c", 6, "hard", 5, *thresholds)
    text = plain_text(parts, 7, 100, 200)
    for charges, order in (([charge], [1]), ([charge, other], [1, 2]), ([other, charge], [2, 1])):
        mixed = [text if found is charge else found for found in charges]
        found = call_parameters(7, "e-1", "fp", 10, 11, None, mixed, order)
        assert found == call_parameters(7, "e-1", "fp", 10, 11, None, charges)
