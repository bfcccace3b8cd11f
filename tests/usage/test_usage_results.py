"""Results as operators and workers read them (`metering/usage/results.py`), on
SQLite: which ids were decided, the counts by outcome, one stored result,
an engine's answer as a decision or a conflict, and `Decisions`, the batch's
answers made as they are read, equal to the list made at once."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

import metering
from metering import FrozenClock, Limit, Meter
from metering.domain.events import UsageEvent, make_event
from metering.engine.answers import CONFLICT, DUPLICATE, NEW, Answer
from metering.engine.reference import Decided
from metering.errors import EventConflict, InvalidInput
from metering.storage.results import ResultRecord
from metering.storage.store import Store
from metering.usage.results import (
    Decisions,
    Early,
    applied_of,
    consumed,
    count_results,
    decided,
    outcome_counts,
    rejected_messages,
    result,
)
from tests.servers import copy_sqlite

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


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


def _batch(rng: random.Random) -> list[UsageEvent]:
    """Events over a few subjects and two limits, some denied, with ids
    repeated (the same charges: a duplicate) and reused (others: a conflict)."""
    events: list[UsageEvent] = []
    for n in range(60):
        if events and rng.random() < 0.2:
            again = rng.choice(events)
            charges = again.charges if rng.random() < 0.5 else [("org-9", "calls", 1)]
            events.append(make_event(charges, NOW, again.event_id))
            continue
        charges = [(f"org-{rng.randrange(4)}", "calls", rng.randint(1, 3))]
        if rng.random() < 0.3:
            charges.append((charges[0][0], "tokens", rng.randint(1, 40)))
        events.append(make_event(charges, NOW, f"ev-{n}", {"n": n}))
    return events


def _plain(decided: Sequence[Decided]) -> list[object]:
    """Decisions as values: a conflict (an exception) by its id."""
    return [d.event_id if isinstance(d, EventConflict) else d for d in decided]


def _meter(url: str) -> Meter:
    meter = Meter(url, clock=FrozenClock(NOW))
    meter.set_limit(Limit("calls", maximum=10, period="1h", window="calendar"))
    meter.set_limit(Limit("tokens", maximum=60, period="1h", window="calendar"))
    return meter


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_batchs_decisions_made_when_read_equal_those_made_at_once(
    sqlite_url: str, sqlite_template: Path, tmp_path: Path, seed: int
) -> None:
    events = _batch(random.Random(seed))
    eager_url = copy_sqlite(sqlite_template, tmp_path / "eager.db")
    with _meter(sqlite_url) as meter, _meter(eager_url) as other:
        decided = meter.apply(events)
        records = [e.record() for e in events]
        answers = other.apply_records(records)
        eager = [applied_of(e.event_id, a) for e, a in zip(events, answers, strict=True)]
    assert isinstance(decided, metering.Decisions) and len(decided) == len(eager) == 60
    assert _plain(Decisions([e.event_id for e in events], answers)) == _plain(eager)  # all at once
    assert {type(d).__name__ for d in eager} == {"Decision", "EventConflict"}
    assert {d.outcome for d in eager if not isinstance(d, EventConflict)} >= {"allowed", "denied"}
    picked = random.Random(seed).sample(range(60), 10)  # some read first, out of order
    assert [_plain([decided[n]]) for n in picked] == [_plain([eager[n]]) for n in picked]
    assert _plain(decided) == _plain(eager)
    assert _plain(decided[5:-5:2]) == _plain(eager[5:-5:2])
    assert _plain([decided[-1]]) == _plain([eager[-1]])
    assert decided[7] is decided[7] and decided[-1] is decided[59]
    assert list(decided) == decided == decided[:] and decided != tuple(decided)
    assert decided != eager[:-1] and decided != object()
    with pytest.raises(IndexError):
        decided[60]
    with pytest.raises(TypeError):
        hash(decided)
    assert repr(decided).startswith("Decisions([Decision(")


def test_decisions_made_early_are_kept_only_for_the_answers_they_were_made_of() -> None:
    answers = [Answer(CONFLICT), Answer(CONFLICT)]
    early = Early(["a", "b"])
    assert early.decisions(answers)._made is None  # none made: made when read
    early.make(answers)
    kept = early.decisions(answers)
    assert kept._made is not None and _plain(kept) == ["a", "b"]
    other = early.decisions(list(answers))  # another run's answers (equal, not the same)
    assert other._made is None and _plain(other) == ["a", "b"]


def test_a_batchs_decisions_of_every_shape_of_row_are_each_answers_decision() -> None:
    """`Decisions` made at once (`decisions_of`) equal those made one by one
    (`applied_of`): rows with grants, a price or an overdraft, several charges,
    a duplicate, a conflict."""
    base = ["org", "calls", 1, True, "allowed", 3, 7, 10, 0, 0, 3_600_000_000, None]
    rows = [
        [base],
        [[*base, [["g-1", 1]]]],
        [[*base, [], ["USD", 25]]],
        [[*base, [["g-1", 1], ["g-2", 2]], ["USD", 25], 4]],
        [base, [*base[:4], "denied", 3, 7, 10, 0, 0, 3_600_000_000, 3_600_000_000]],
    ]
    answers = [
        Answer(NEW if n % 2 else DUPLICATE, _record(f"e{n}", charges, n))
        for n, charges in enumerate(rows)
    ]
    answers.append(Answer(CONFLICT))
    ids = [f"e{n}" for n in range(len(answers))]
    at_once = list(Decisions(ids, answers))
    one_by_one = [applied_of(i, a) for i, a in zip(ids, answers, strict=True)]
    assert _plain(at_once) == _plain(one_by_one)
    assert at_once[0].occurred_at == datetime(1970, 1, 1, tzinfo=UTC)  # type: ignore[union-attr]


def _record(event_id: str, charges: list[list[object]], n: int) -> ResultRecord:
    return ResultRecord(event_id, "allowed", "fp", n, 10**15, (), None, charges, None)
