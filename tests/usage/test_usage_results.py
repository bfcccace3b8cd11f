"""Results as operators and workers read them (`metering/usage/results.py`), on
SQLite: which ids were decided, the counts by outcome, one stored result,
and an engine's answer as a decision or a conflict."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metering import Limit, Meter
from metering.engine.answers import CONFLICT, DUPLICATE, NEW, Answer
from metering.errors import EventConflict, InvalidInput
from metering.storage.store import Store
from metering.usage.results import (
    applied_of,
    consumed,
    count_results,
    decided,
    outcome_counts,
    rejected_messages,
    result,
)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=2, period="1h"))
        for n in range(3):
            meter.consume("org", "calls", event_id=f"e{n}")
        yield meter


def test_the_decided_ids_are_those_with_a_result(meter: Meter) -> None:
    assert decided(meter.database, ["e0", "e2", "e9"]) == {"e0", "e2"}
    assert decided(meter.database, []) == set()


def test_results_are_counted_by_outcome(meter: Meter) -> None:
    assert outcome_counts(meter.database) == {"allowed": 2, "denied": 1}
    assert count_results(meter.database) == 3


def test_a_stored_result_reads_back_as_its_decision(meter: Meter) -> None:
    stored = result(meter.database, "e2")
    assert stored is not None
    assert (stored.event_id, stored.outcome, stored.duplicate) == ("e2", "denied", False)
    assert result(meter.database, "e9") is None
    with pytest.raises(InvalidInput):
        result(meter.database, "")


def test_a_count_of_dead_letters_is_bounded(meter: Meter) -> None:
    assert rejected_messages(meter.database, 5) == []
    with pytest.raises(InvalidInput):
        rejected_messages(meter.database, 0)


def test_an_answer_is_a_decision_a_repeat_or_a_conflict(meter: Meter) -> None:
    record = meter.database.run(lambda c: Store(c).fetch_results(["e0"]))["e0"]
    repeated = applied_of("e0", Answer(DUPLICATE, record))
    assert not isinstance(repeated, EventConflict)
    assert repeated.duplicate and repeated.outcome == "allowed"
    assert consumed("e0", Answer(NEW, record)).duplicate is False
    assert isinstance(applied_of("e0", Answer(CONFLICT)), EventConflict)
    with pytest.raises(EventConflict, match="'e0'"):
        consumed("e0", Answer(CONFLICT))
