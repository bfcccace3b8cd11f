"""`metering report shadow` against an independent model, on SQLite and PostgreSQL.

The model is a few lines of plain Python sharing nothing with `metering`:
a hard limit consumes a charge iff ``used + cost <= maximum`` in its window,
else counts a would-deny. Hypothesis draws subjects, costs and instants on a
shadow limit (one subject with its own entitlement); the report must say
what the model says, and after promotion to hard the counters stay and the
next decision is denied exactly where the model says so.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metering import FrozenClock, Limit, Meter
from metering.cli import main
from metering.domain.events import make_event
from metering.errors import InvalidInput, UnknownLimit
from metering.reports import (
    SHADOW_COLUMNS,
    ShadowRow,
    overage_report,
    select_shadow,
    shadow_report,
)

START = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)  # on the hour: windows are hours
HOUR = timedelta(hours=1)
DEFAULT_MAXIMUM = 5
SUBJECTS = ("org-a", "org-b", "org-c")
NAMES = (f"probe_{n}" for n in itertools.count())


@dataclass
class Window:
    used: int = 0
    count: int = 0
    cost: int = 0
    first: datetime | None = None


@dataclass
class Model:
    """What a hard limit would have done, window by window."""

    maximums: dict[str, int]
    windows: dict[tuple[str, int], Window] = field(default_factory=dict)

    def maximum(self, subject: str) -> int:
        return self.maximums.get(subject, DEFAULT_MAXIMUM)

    def charge(self, subject: str, hour: int, cost: int, when: datetime) -> None:
        window = self.windows.setdefault((subject, hour), Window())
        if window.used + cost <= self.maximum(subject):
            window.used += cost
        else:
            window.count += 1
            window.cost += cost
            window.first = window.first or when

    def rows(self, name: str) -> list[tuple[object, ...]]:
        found = []
        for subject in SUBJECTS:
            mine = sorted(
                (hour, w) for (s, hour), w in self.windows.items() if s == subject and w.count
            )
            if not mine:
                continue
            peak_hour, peak = min(mine, key=lambda hw: (-hw[1].cost, hw[0]))
            start = START + peak_hour * HOUR
            found.append(
                (
                    subject,
                    name,
                    sum(w.count for _, w in mine),
                    sum(w.cost for _, w in mine),
                    len(mine),
                    min(w.first for _, w in mine if w.first is not None),
                    start,
                    start + HOUR,
                    peak.used,
                    self.maximum(subject),
                    peak.cost,
                )
            )
        return sorted(found, key=lambda r: (-r[3], -r[2], r[0]))  # type: ignore[operator]


def tuples(rows: list[ShadowRow]) -> list[tuple[object, ...]]:
    return [tuple(getattr(row, name) for name in SHADOW_COLUMNS) for row in rows]


events = st.lists(
    st.tuples(
        st.sampled_from(SUBJECTS),
        st.integers(0, 2),  # the hour
        st.integers(0, 3599),  # the second in it
        st.integers(1, 7),  # the cost: some larger than the default maximum
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.slow
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=events, entitled=st.none() | st.integers(1, 9), promoted_cost=st.integers(1, 4))
def test_the_shadow_report_is_the_models_and_promotion_keeps_the_counters(
    db_url: str,
    drawn: list[tuple[str, int, int, int]],
    entitled: int | None,
    promoted_cost: int,
) -> None:
    name = next(NAMES)  # one limit per example: no database to make each time
    clock = FrozenClock(START + 2 * HOUR + timedelta(minutes=59, seconds=59))
    with Meter(db_url, clock=clock) as meter:
        meter.set_limit(
            Limit(
                name, maximum=DEFAULT_MAXIMUM, period="1h", window="calendar", enforcement="shadow"
            )
        )
        model = Model({} if entitled is None else {"org-a": entitled})
        if entitled is not None:
            meter.set_entitlement("org-a", name, entitled, effective_from=START - HOUR)
        ordered = sorted(drawn, key=lambda e: (e[1], e[2]))
        batch = []
        for subject, hour, second, cost in ordered:
            when = START + hour * HOUR + timedelta(seconds=second)
            model.charge(subject, hour, cost, when)
            batch.append(make_event([(subject, name, cost)], when))
        decided = meter.apply(batch)
        assert all(d.allowed for d in decided)  # a shadow limit never denies

        assert tuples(shadow_report(meter, name)) == model.rows(name)
        assert tuples(shadow_report(meter, name, top=1)) == model.rows(name)[:1]
        hour_one = shadow_report(meter, name, since=START + HOUR, until=START + 2 * HOUR)
        assert sum(r.would_deny_cost for r in hour_one) == sum(
            w.cost for (_, hour), w in model.windows.items() if hour == 1
        )
        # The overage report bills none of it, and shows it as would-denies.
        for row in overage_report(meter, limit=name):
            window = model.windows[(row.subject, (row.window_start - START) // HOUR)]
            assert (row.enforcement, row.overage) == ("shadow", 0)
            assert (row.used, row.denied_events, row.denied) == (
                window.used,
                window.count,
                window.cost,
            )

        meter.set_limit(Limit(name, maximum=DEFAULT_MAXIMUM, period="1h", window="calendar"))
        kept = {(r.subject, r.window_start): r for r in overage_report(meter, limit=name)}
        for (subject, hour), window in model.windows.items():
            row = kept[(subject, START + hour * HOUR)]
            assert (row.enforcement, row.used, row.denied, row.overage) == (
                "hard",
                window.used,
                window.cost,
                0,  # denials are never overage
            )
        for subject in SUBJECTS:
            used = model.windows.get((subject, 2), Window()).used
            decision = meter.consume(subject, name, cost=promoted_cost)
            fits = used + promoted_cost <= model.maximum(subject)
            assert decision.allowed == fits, (subject, used, promoted_cost)
            assert decision.outcome == ("allowed" if fits else "denied")


# -- filters and errors -----------------------------------------------------------


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    """A shadow limit that would have denied org-a twice and org-b once."""
    clock = FrozenClock(START)
    with Meter(sqlite_url, clock=clock) as meter:
        meter.set_limits(
            [
                Limit("probe", maximum=3, period="1h", window="calendar", enforcement="shadow"),
                Limit("seats", maximum=3, period="1mo", window="calendar"),
                Limit("calls", maximum=3, period="1mo", window="calendar", enforcement="soft"),
                Limit(
                    "burst", maximum=3, period="10s", algorithm="token_bucket", enforcement="shadow"
                ),
            ]
        )
        for subject, cost, minutes in [
            ("org-a", 2, 0),
            ("org-a", 2, 1),  # would deny: 2 + 2 > 3
            ("org-b", 3, 2),
            ("org-b", 1, 3),  # would deny
            ("org-a", 3, 61),
            ("org-a", 4, 62),  # would deny, the next hour: org-a's peak
        ]:
            clock.set(START + timedelta(minutes=minutes))
            meter.consume(subject, "probe", cost=cost)
        yield meter


def test_rows_filters_and_the_peak_window(meter: Meter) -> None:
    rows = shadow_report(meter, "probe")
    assert [(r.subject, r.would_deny_events, r.would_deny_cost, r.windows) for r in rows] == [
        ("org-a", 2, 6, 2),
        ("org-b", 1, 1, 1),
    ]
    org_a = rows[0]
    assert (org_a.peak_window_start, org_a.peak_used, org_a.peak_maximum) == (
        START + HOUR,
        3,
        3,
    )
    assert org_a.peak_would_deny_cost == 4
    assert org_a.first_would_deny_at == START + timedelta(minutes=1)
    assert [r.subject for r in shadow_report(meter, "probe", subject="org-b")] == ["org-b"]
    assert [r.subject for r in shadow_report(meter, "probe", top=1)] == ["org-a"]
    assert [r.would_deny_cost for r in shadow_report(meter, "probe", since=START + HOUR)] == [4]
    assert shadow_report(meter, "probe", period="2026-10") == []
    assert select_shadow(meter, "probe").count() == 2
    assert select_shadow(meter, "probe", top=1).count() == 1
    assert select_shadow(meter, "probe", subject="org-c").count() == 0


@pytest.mark.parametrize(
    ("limit", "filters", "error", "field", "words"),
    [
        ("nope", {}, UnknownLimit, None, "nope"),
        ("seats", {}, InvalidInput, "limit", "seats is a hard limit, not shadow"),
        ("calls", {}, InvalidInput, "limit", "report overage"),
        ("burst", {}, InvalidInput, "limit", "token bucket"),
        ("Not A Name", {}, InvalidInput, "name", "must be 1 to 64"),
        ("probe", {"period": "2026-13"}, InvalidInput, "period", "not a month"),
        ("probe", {"since": "2026-11-02", "until": "2026-11-01"}, InvalidInput, "since", "before"),
        ("probe", {"top": 0}, InvalidInput, "top", "at least 1"),
        ("probe", {"subject": ""}, InvalidInput, "subject", ""),
    ],
)
def test_bad_input_raises(
    meter: Meter,
    limit: str,
    filters: dict[str, Any],
    error: type[Exception],
    field: str | None,
    words: str,
) -> None:
    with pytest.raises(error) as raised:
        shadow_report(meter, limit, **filters)
    if field is not None:
        assert raised.value.field == field  # type: ignore[attr-defined]
    assert words in str(raised.value)


# -- the command line ---------------------------------------------------------------


def run(meter: Meter, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, ["--database", meter.url, "report", "shadow", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_the_cli_writes_the_report_as_a_table_csv_and_json(meter: Meter) -> None:
    rows = shadow_report(meter, "probe")
    table = run(meter, "--limit", "probe").stdout
    assert "Would deny (probe), all time" in table and "org-a" in table and "org-b" in table
    as_csv = run(meter, "--limit", "probe", "--format", "csv").stdout
    header, *lines = list(csv.reader(io.StringIO(as_csv)))
    assert tuple(header) == SHADOW_COLUMNS
    assert [line[:5] for line in lines] == [
        [r.subject, r.limit, str(r.would_deny_events), str(r.would_deny_cost), str(r.windows)]
        for r in rows
    ]
    as_json = json.loads(run(meter, "--limit", "probe", "--format", "json").stdout)
    assert as_json["report"] == "shadow" and as_json["limit"] == "probe"
    assert as_json["rows"] == [r.to_dict() for r in rows]
    month = run(meter, "--limit", "probe", "--month", "2026-11", "--top", "1", "--format", "json")
    assert [r["subject"] for r in json.loads(month.stdout)["rows"]] == ["org-a"]
    assert "no windows" in run(meter, "--limit", "probe", "--period", "2026-10").stdout
    with_bar = run(meter, "--limit", "probe", "--format", "csv", "--progress").stdout
    assert with_bar == as_csv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--limit", "nope"), "unknown limit 'nope'"),
        (("--limit", "seats"), "seats is a hard limit, not shadow"),
        (("--limit", "seats"), "metering report overage"),
        (("--limit", "probe", "--period", "2026-13"), "period: '2026-13' is not a month"),
        (("--limit", "probe", "--since", "2026-12-01", "--until", "2026-11-01"), "not before"),
        (("--limit", "probe", "--month", "2026-11", "--since", "2026-11-01"), "not both"),
        (("--limit", "probe", "--top", "0"), "top: must be a whole number of at least 1"),
        (("--limit", "probe", "--format", "xml"), "--format"),
        ((), "--limit"),
    ],
)
def test_bad_input_is_a_one_line_error(meter: Meter, args: tuple[str, ...], message: str) -> None:
    result = run(meter, *args, code=1)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""
