"""The results table (`storage/results.py`) on SQLite and PostgreSQL: a record
is its row and back; an id inserted twice is kept once; reads by id, in
chunks or PostgreSQL's arrays alike; a window's allowed results."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from metering import Meter
from metering.domain.events import FUTURE_TOLERANCE_US
from metering.domain.state import CounterKey
from metering.storage.on_connection import PG_BULK_ROWS
from metering.storage.results import ResultRecord, ResultStore, record_from_row, result_row

T = TypeVar("T")
HOUR = 3_600_000_000


def _record(
    event_id: str, outcome: str = "allowed", at: int = 10, **fields: object
) -> ResultRecord:
    charge = ["org", "calls", 2, outcome != "denied", outcome, 2, 8, 10, 0, 0, HOUR, None]
    values: dict[str, object] = {
        "event_id": event_id,
        "outcome": outcome,
        "fingerprint": '[["org","calls",2]]',
        "occurred_at_us": at,
        "decided_at_us": at + 1,
        "denied_by": ("calls",) if outcome == "denied" else (),
        "reason": None,
        "charges": [charge],
        "metadata": None,
    }
    values.update(fields)
    return ResultRecord(**values)  # type: ignore[arg-type]


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url) as meter:
        yield meter


def _on(meter: Meter, work: Callable[[ResultStore], T]) -> T:
    return meter.database.run(lambda connection: work(ResultStore(connection)))


def test_a_record_is_its_row_and_back() -> None:
    record = _record("e1", "denied", metadata={"route": "/a", "n": 1}, reason="too late")
    row = result_row(record)
    assert (
        row[5] == "calls"
        and row[7] == '[["org","calls",2,false,"denied",2,8,10,0,0,3600000000,null]]'
    )
    assert record_from_row(row) == record
    plain = _record("e2")
    assert result_row(plain)[5] is None and result_row(plain)[8] is None
    assert record_from_row(result_row(plain)) == plain
    stacked = _record("e3", "denied", denied_by=("calls", "seats"))
    assert result_row(stacked)[5] == "calls,seats"
    assert record_from_row(result_row(stacked)).denied_by == ("calls", "seats")


@pytest.mark.parametrize("count", [3, PG_BULK_ROWS + 4])
def test_an_id_inserted_again_is_kept_once(meter: Meter, count: int) -> None:
    records = [_record(f"e{n:03}", metadata={"n": n}) for n in range(count)]
    assert _on(meter, lambda store: store.insert_results(records)) == {r.event_id for r in records}
    again = [_record("e000", "denied"), _record("new")]
    assert _on(meter, lambda store: store.insert_results(again)) == {"new"}
    fetched = _on(meter, lambda store: store.fetch_results([r.event_id for r in records]))
    assert fetched == {r.event_id: r for r in records}  # the first e000 stands
    assert _on(meter, lambda store: store.count_results()) == count + 1
    assert _on(meter, lambda store: store.insert_results([])) == set()


def test_reads_by_id_and_counts_by_outcome(meter: Meter) -> None:
    records = [_record("a"), _record("b", "denied"), _record("c", "overage")]
    _on(meter, lambda store: store.insert_results(records))
    assert _on(meter, lambda store: store.fetch_results(["b", "b", "x"])) == {"b": records[1]}
    assert _on(meter, lambda store: store.fetch_results([])) == {}
    assert _on(meter, lambda store: store.decided_ids(["a", "x", "c"])) == {"a", "c"}
    assert _on(meter, lambda store: store.outcome_counts()) == {
        "allowed": 1,
        "denied": 1,
        "overage": 1,
    }


def test_a_results_charges_can_be_rewritten(meter: Meter) -> None:
    _on(meter, lambda store: store.insert_results([_record("a")]))
    charges = [["org", "calls", 5, True, "allowed", 5, 5, 10, 0, 0, HOUR, None]]
    _on(meter, lambda store: store.rewrite_charges("a", charges))
    assert _on(meter, lambda store: store.fetch_results(["a"]))["a"].charges == charges


def test_a_windows_results_are_the_allowed_ones_in_reach(meter: Meter) -> None:
    start, end = 10 * HOUR, 11 * HOUR
    records = [
        _record("in", at=start),
        _record("soft", "overage", at=end - 1),
        _record("denied", "denied", at=start + 1),
        _record("asking", at=start + 2),
        _record("late", at=start - 2 * HOUR),  # a first-use window takes late events
        _record("too-early", at=start - 2 * HOUR - 1),
        _record("after", at=end),
    ]
    _on(meter, lambda store: store.insert_results(records))
    key = CounterKey("calls", "org", start, end)
    found = _on(meter, lambda store: store.window_results(key, "asking"))
    assert sorted(event_id for event_id, *_ in found) == ["in", "late", "soft"]
    in_row = next(row for row in found if row[0] == "in")
    assert in_row[1:3] == (start, start + 1)


def test_a_windows_results_are_found_by_when_they_were_decided_too(meter: Meter) -> None:
    # The decided time's index narrows the scan: an event may be decided up to
    # the future's tolerance before it occurred, and no earlier.
    start, end = 10 * HOUR, 11 * HOUR
    earliest = start - 2 * HOUR
    ahead = _record("ahead", at=earliest, decided_at_us=earliest - FUTURE_TOLERANCE_US)
    _on(meter, lambda store: store.insert_results([ahead, _record("late", at=earliest)]))
    key = CounterKey("calls", "org", start, end)
    found = _on(meter, lambda store: store.window_results(key, ""))
    assert sorted(event_id for event_id, *_ in found) == ["ahead", "late"]


@pytest.mark.parametrize("subject", ["org_1", 'org "1"', "örg"])
def test_a_windows_results_are_those_of_its_subject_and_limit_or_more(
    meter: Meter, subject: str
) -> None:
    # Plain text narrows the rows in SQL (LIKE, `_` a character of its own);
    # other text is not narrowed: the caller checks every row either way.
    start, end = 10 * HOUR, 11 * HOUR

    def charged(event_id: str, who: str, limit: str) -> ResultRecord:
        charge = [who, limit, 2, True, "allowed", 2, 8, start, end, 0, HOUR, None]
        return _record(event_id, at=start, charges=[charge])

    records = [
        charged("own", subject, "calls"),
        charged("other-limit", subject, "other"),
        charged("like-subject", "orgX1", "calls"),
        charged("other-subject", "org", "calls"),
    ]
    _on(meter, lambda store: store.insert_results(records))
    key = CounterKey("calls", subject, start, end)
    found = {row[0] for row in _on(meter, lambda store: store.window_results(key, ""))}
    plain = subject == "org_1"
    assert found == ({"own"} if plain else {r.event_id for r in records})
