"""`Meter.import_events` on both databases: bad lines, exactly once by id,
``enforce=False`` and ``allow_late``, CSV metadata, the reference engine."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from servers import copy_sqlite
from sqlalchemy import func, select

from metering import FrozenClock, Limit, Meter, spend_limit
from metering.errors import InvalidInput
from metering.storage.tables import webhook_messages

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("calls", maximum=3, period="1d", window="calendar", thresholds=(100,)))
        m.set_limit(Limit("api", maximum=2, period="2s", algorithm="token_bucket"))
        m.set_limit(Limit("visits", maximum=2, period="1h"))
        yield m


def line(event_id: str, subject: str, limit: str, at: datetime, cost: int = 1) -> str:
    item = {"event_id": event_id, "subject": subject, "limit": limit, "cost": cost}
    return json.dumps({**item, "occurred_at": at.isoformat()}) + "\n"


def used(meter: Meter, subject: str, limit: str) -> list[int]:
    return [c.used for c in meter.counters(subject, limit)]


def test_bad_lines_are_reported_with_their_numbers_and_the_good_ones_applied(
    meter: Meter,
) -> None:
    lines = [
        line("e1", "org-1", "calls", NOW),
        "{oops\n",
        line("e2", "org-1", "calls", NOW, cost=-1),
        "\n",
        line("e3", "org-1", "calls", NOW),
        line("e4", "org-1", "nope", NOW),
    ]
    summary = meter.import_events(lines)
    assert [(b.line, b.reason.split(":")[0]) for b in summary.bad_lines] == [
        (2, "not JSON"),
        (3, "cost"),
    ]
    assert (summary.events, summary.applied, summary.rejected, summary.bad) == (3, 2, 1, 2)
    assert used(meter, "org-1", "calls") == [2]
    rejected = meter.result("e4")
    assert rejected is not None and rejected.outcome == "rejected"


def test_a_second_run_changes_nothing_and_counts_the_duplicates(meter: Meter) -> None:
    lines = [line(f"e{i}", "org-1", "calls", NOW - timedelta(minutes=i)) for i in range(5)]
    first = meter.import_events(lines, batch_size=2)
    assert (first.applied, first.denied, first.duplicates) == (3, 2, 0)
    before = (meter.counters(), meter.outcome_counts())
    again = meter.import_events(lines, batch_size=3)
    assert (again.events, again.applied, again.denied, again.duplicates) == (5, 0, 0, 5)
    assert (meter.counters(), meter.outcome_counts()) == before
    changed = meter.import_events([line("e0", "org-1", "calls", NOW, cost=2)])
    assert (changed.conflicts, changed.applied) == (1, 0)


def test_no_enforce_allows_everything_as_a_soft_limit_and_notifies_nothing(
    meter: Meter,
) -> None:
    lines = [line(f"e{i}", "org-1", "calls", NOW, cost=2) for i in range(3)]
    lines += [line(f"b{i}", "org-1", "api", NOW) for i in range(3)]
    summary = meter.import_events(lines, enforce=False)
    assert (summary.applied, summary.denied) == (6, 0)
    assert used(meter, "org-1", "calls") == [6]
    last = meter.result("e2")
    assert last is not None
    assert (last.outcome, last.charges[0].overage, last.reason) == (
        "overage",
        3,
        "imported: not enforced",
    )
    bucket = meter.result("b2")
    assert bucket is not None and (bucket.outcome, bucket.charges[0].outcome) == (
        "allowed",
        "would_deny",
    )
    with meter.sql_engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(webhook_messages)) == 0
    # The same events enforced: the usual batch path denies.
    enforced = meter.import_events([line(f"x{i}", "org-2", "calls", NOW, cost=2) for i in range(2)])
    assert (enforced.applied, enforced.denied) == (1, 1)


def test_allow_late_accepts_old_events_and_marks_their_results(meter: Meter) -> None:
    old = NOW - timedelta(days=40)
    rejected = meter.import_events([line("late-1", "org-1", "calls", old)])
    assert rejected.rejected == 1
    late = meter.result("late-1")
    assert late is not None and "lateness" in (late.reason or "")
    summary = meter.import_events(
        [line("late-2", "org-1", "calls", old), line("late-3", "org-1", "calls", old, cost=3)],
        allow_late=True,
    )
    assert (summary.applied, summary.denied) == (1, 1)  # enforced: 1 + 3 > 3
    found = meter.result("late-2")
    assert found is not None
    assert (found.outcome, found.reason) == ("allowed", "imported: lateness not checked")
    assert [c.window_start for c in meter.counters("org-1", "calls")] == [
        datetime(2026, 10, 17, tzinfo=UTC)
    ]


def test_history_before_a_first_use_window_goes_through_the_reference_engine(
    meter: Meter,
) -> None:
    # The current window opened at NOW: older events need the general engine.
    meter.consume("org-1", "visits", event_id="live", occurred_at=NOW)
    older = [line(f"h{i}", "org-1", "visits", NOW - timedelta(hours=3), cost=2) for i in range(2)]
    summary = meter.import_events(older, enforce=False, allow_late=True)
    assert (summary.applied, summary.denied) == (2, 0)
    found = meter.result("h1")
    assert found is not None
    assert (found.outcome, found.reason) == (
        "overage",
        "imported: not enforced, lateness not checked",
    )
    assert sorted(used(meter, "org-1", "visits")) == [1, 4]


def test_csv_with_metadata_columns(meter: Meter) -> None:
    text = (
        "event_id,subject,limit,cost,occurred_at,region,plan\n"
        f"c1,org-1,calls,2,{NOW.isoformat()},eu,\n"
        f"c2,org-2,calls,1,{NOW.isoformat()},us,pro\n"
    )
    summary = meter.import_events(io.StringIO(text))
    assert summary.applied == 2
    first, second = meter.result("c1"), meter.result("c2")
    assert first is not None and second is not None
    assert (first.metadata, second.metadata) == ({"region": "eu"}, {"region": "us", "plan": "pro"})
    assert used(meter, "org-1", "calls") == [2]


def test_strict_applies_nothing_when_a_line_is_bad(meter: Meter) -> None:
    lines = [line("s1", "org-1", "calls", NOW), "{}\n", "[]\n"]
    with pytest.raises(InvalidInput, match=r"line 2: .*\(and 1 more bad lines\); nothing"):
        meter.import_events(lines, strict=True)
    assert meter.count_results() == 0
    assert meter.import_events(lines[:1], strict=True).applied == 1


def test_a_file_by_path_and_bytes_that_are_not_utf8(meter: Meter, tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "events.jsonl"
    path.write_text(line("p1", "org-1", "calls", NOW))
    assert meter.import_events(path).applied == 1
    with pytest.raises(InvalidInput, match="not UTF-8"):
        meter.import_events(io.BytesIO(b'{"event_id": "\xff"}\n'))
    with pytest.raises(InvalidInput, match="cannot read"):
        meter.import_events(Path(str(tmp_path)) / "missing.jsonl")


@pytest.mark.parametrize(("enforce", "allow_late"), [(True, True), (False, False), (False, True)])
def test_both_engines_apply_the_flags_alike(
    tmp_path: Path, sqlite_template: Path, enforce: bool, allow_late: bool
) -> None:
    """The same events under the same flags, once by the fast path and once
    by the reference engine (an event before its subject's current first-use
    window sends its whole batch there): the same results and counters."""
    limits = [
        Limit("calls", maximum=3, period="1d", window="calendar", thresholds=(100,)),
        Limit("api", maximum=2, period="2s", algorithm="token_bucket"),
        Limit("visits", maximum=2, period="1h"),
        Limit("seen", maximum=2, period="1h", enforcement="shadow"),
    ]
    events = [
        line(f"{name}-{i}", f"org-{i % 2}", name, NOW - timedelta(hours=30 - i), cost=1 + i % 3)
        for i in range(24)
        for name in ("calls", "api", "visits", "seen")
    ]
    pusher = line("push", "zz", "visits", NOW - timedelta(hours=3))
    found = []
    for name, batches in (("fast", [events, [pusher]]), ("reference", [[*events, pusher]])):
        url = copy_sqlite(sqlite_template, tmp_path / f"{name}.db")
        with Meter(url, clock=FrozenClock(NOW)) as meter:
            meter.set_limits(limits)
            meter.consume("zz", "visits", event_id="live", occurred_at=NOW)
            for batch in batches:
                meter.import_events(batch, enforce=enforce, allow_late=allow_late)
            decided = [meter.result(json.loads(text)["event_id"]) for text in events]
            found.append(
                (
                    [(d.outcome, d.charges, d.reason) for d in decided if d is not None],
                    [c for c in meter.counters() if c.subject != "zz"],
                )
            )
    assert found[0] == found[1]
    assert len(found[0][0]) == len(events)


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_no_enforce_does_not_enforce_a_spend_cap_either(db_url: str, path: str) -> None:
    """History of priced usage is recorded whole: a spend cap is decided as
    a soft limit too, by the fast path and by the reference engine."""
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        if path == "reference":
            meter._engine.paths = [meter._engine.path("reference")]
        meter.set_limit(Limit("calls", maximum=100, period="1d", window="calendar"))
        meter.set_limit(spend_limit("usd", "0.05", "USD", "1d", window="calendar"))
        meter.set_price("calls", "0.02", "USD", effective_from=NOW - timedelta(days=1))
        lines = [line(f"p{i}", "org-1", "calls", NOW) for i in range(4)]
        summary = meter.import_events(lines, enforce=False)
        assert (summary.applied, summary.denied) == (4, 0)
        last = meter.result("p3")
        assert last is not None and last.outcome == "overage"
        assert [c.used for c in meter.counters("org-1", "usd")] == [8]
        enforced = meter.import_events([line(f"q{i}", "org-2", "calls", NOW) for i in range(4)])
        assert (enforced.applied, enforced.denied) == (2, 2)


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_no_enforce_records_a_quarantined_subjects_usage_as_overage(db_url: str, path: str) -> None:
    """A quarantine's maximum is held as an import holds any hard maximum:
    not enforced, usage past it is overage, never denied."""
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        if path == "reference":
            engine = meter._engine
            engine.paths = [engine.path("reference")]
        guarded = Limit(
            "api",
            maximum=100_000,
            period="1d",
            window="calendar",
            breaker="10x",
            breaker_floor=0.1,
            quarantine_max=1000,
        )
        meter.set_limit(guarded)
        while meter.consume("org-1", "api", 60).allowed:
            clock.advance(seconds=1)
        assert [q.subject for q in meter.quarantines()] == ["org-1"]
        summary = meter.import_events([line("h1", "org-1", "api", clock())], enforce=False)
        assert (summary.applied, summary.denied) == (1, 0)
        found = meter.result("h1")
        assert found is not None and (found.outcome, found.reason) == (
            "overage",
            "imported: not enforced",
        )
        enforced = meter.import_events([line("h2", "org-1", "api", clock())])
        assert (enforced.applied, enforced.denied) == (0, 1)


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_no_enforce_tells_no_forecast(db_url: str, path: str) -> None:
    """History announces nothing: a limit with a forecast lead, run out
    within the lead by an import that does not enforce, writes no
    ``limit.forecast``; the same usage enforced does."""
    clock = FrozenClock(NOW)
    with Meter(db_url, clock=clock) as meter:
        if path == "reference":
            meter._engine.paths = [meter._engine.path("reference")]
        meter.set_limit(
            Limit("calls", maximum=1_000, period="1d", window="calendar", forecast_lead="1h")
        )
        for subject, enforce in (("org-1", False), ("org-2", True)):
            meter.import_events(
                [line(f"{subject}-a", subject, "calls", NOW, cost=360)], enforce=enforce
            )
            clock.advance(seconds=60)
            meter.import_events(
                [line(f"{subject}-b", subject, "calls", clock(), cost=360)], enforce=enforce
            )
        with meter.sql_engine.connect() as connection:
            kinds = connection.execute(select(webhook_messages.c.type)).scalars().all()
        assert kinds == ["limit.forecast"]
