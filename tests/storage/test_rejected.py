"""Queued events the database refuses go to the dead-letter record; the rest of
their batch is applied (SQLite and PostgreSQL, through `apply_batch`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter, make_event
from metering.errors import EventConflict, InputRefused, StorageError
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
        yield m


def refuse_results_for(meter: Meter, event_ids: list[str], *, sqlstate: str) -> None:
    """A trigger that refuses the results row of these events, as a CHECK would."""
    listed = ", ".join(f"'{event_id}'" for event_id in event_ids)
    with meter.sql_engine.begin() as connection:
        if meter.sql_engine.dialect.name == "sqlite":
            # SQLite reports a trigger's ABORT as a constraint failure.
            connection.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON results "
                f"WHEN NEW.event_id IN ({listed}) BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
            return
        connection.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.event_id IN ({listed}) THEN "
            f"RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}'; END IF; "
            "RETURN NEW; END $$"
        )
        connection.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON results FOR EACH ROW EXECUTE FUNCTION refuse()"
        )


def batch(ids: list[str]) -> dict[str, object]:
    return encode_batch([encode_event(make_event([("org", "api", 1)], NOW, i)) for i in ids])


def test_refused_events_are_dead_lettered_and_the_rest_applied_in_order(meter: Meter) -> None:
    ids = [f"e{n}" for n in range(13)]
    refuse_results_for(meter, ["e0", "e6", "e7", "e12"], sqlstate="23514")

    report = apply_batch(meter, batch(ids))

    applied = [i for i in ids if i not in {"e0", "e6", "e7", "e12"}]
    assert meter.decided(ids) == set(applied)
    assert (report.applied, report.malformed) == (len(applied), 4)
    # Applied in order: the n-th allowed event saw n - 1 units used before it.
    remaining = [meter.result(i).charges[0].remaining for i in applied]  # type: ignore[union-attr]
    assert remaining == list(range(99, 99 - len(applied), -1))
    [counter] = meter.counters("org", "api")
    assert counter.used == len(applied)
    dead = {
        event_id: (reason, json.loads(raw)) for event_id, reason, raw in meter.rejected_messages()
    }
    assert sorted(dead) == ["e0", "e12", "e6", "e7"]
    assert all("refused by the database" in reason for reason, _ in dead.values())
    assert dead["e6"][1]["charges"] == [["org", "api", 1]]


def test_a_redelivered_batch_with_a_refused_event_changes_nothing_twice(meter: Meter) -> None:
    ids = ["a", "b", "c"]
    refuse_results_for(meter, ["b"], sqlstate="22021")
    apply_batch(meter, batch(ids))
    again = apply_batch(meter, batch(ids))
    assert (again.applied, again.duplicates) == (0, 2)
    assert [c.used for c in meter.counters("org", "api")] == [2]
    assert len(meter.rejected_messages()) == 1


def test_a_failure_that_is_not_a_refusal_still_fails_the_batch(meter: Meter, db_url: str) -> None:
    """Only data errors are dead-lettered: any other error is raised for the task to retry."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite raises every trigger ABORT as a constraint failure")
    refuse_results_for(meter, ["b"], sqlstate="P0001")
    with pytest.raises(StorageError) as caught:
        apply_batch(meter, batch(["a", "b"]))
    assert not isinstance(caught.value, InputRefused)
    assert meter.decided(["a", "b"]) == set() and meter.rejected_messages() == []


@pytest.mark.parametrize("group_commit", [True, False])
def test_a_conflict_raised_to_a_caller_is_not_dead_lettered(
    db_url: str, group_commit: bool
) -> None:
    """The dead-letter record is for queued input nobody could be told about;
    a synchronous caller gets `EventConflict` and nothing is stored."""
    with Meter(db_url, clock=FrozenClock(NOW), group_commit=group_commit) as meter:
        meter.set_limit(Limit("api", maximum=100, period="1d", window="calendar"))
        meter.consume("org", "api", 1, event_id="same")
        with pytest.raises(EventConflict):
            meter.consume("org", "api", 2, event_id="same")
        assert meter.rejected_messages() == []
        # Queued, the same conflict is kept: no caller is waiting for it.
        apply_batch(
            meter, encode_batch([encode_event(make_event([("org", "api", 3)], NOW, "same"))])
        )
        [(event_id, reason, _)] = meter.rejected_messages()
        assert event_id == "same" and "different charges" in reason


def unknown_limit_batch(ids: list[str], limit: str = "apii") -> dict[str, object]:
    return encode_batch([encode_event(make_event([("org", limit, 2)], NOW, i)) for i in ids])


@pytest.mark.parametrize("ids", [["u1"], ["u1", "u2"]], ids=["one", "batch"])
def test_an_event_rejected_for_an_unknown_limit_is_kept_with_its_input(
    meter: Meter, ids: list[str]
) -> None:
    """The rejected result is the answer; the dead letter keeps the event
    itself, so it is listed and can be applied once the limit exists."""
    report = apply_batch(meter, unknown_limit_batch(ids))
    assert report.rejected == len(ids)
    listed = sorted(meter.rejected_messages(10))
    assert [(r.event_id, r.reason) for r in listed] == [
        (i, "unknown limit 'apii': define it with `metering limits set`") for i in ids
    ]
    for event_id, _, raw in listed:
        assert json.loads(raw) == encode_event(make_event([("org", "apii", 2)], NOW, event_id))
    apply_batch(meter, unknown_limit_batch(ids))  # delivered again: still one each
    assert len(meter.rejected_messages(10)) == len(ids)


def test_the_reference_engine_keeps_rejected_events_too(meter: Meter) -> None:
    meter.set_limit(Limit("seats", maximum=5, period="1mo", window="calendar", distinct="user"))
    seat = make_event([("org", "seats", 1)], NOW, "s1", {"user": "ann"})
    unknown = make_event([("org", "apii", 1)], NOW, "u1")
    apply_batch(meter, encode_batch([encode_event(seat), encode_event(unknown)]))
    assert [r.event_id for r in meter.rejected_messages(10)] == ["u1"]
