"""A hard limit is never passed, on every engine path and both databases.

Hypothesis drives one meter through random steps: charges (some stacked on
two hard limits), seat values (new ones and repeats, on a hard and a soft
seat limit), entitlements set, lowered and removed, grants added, and the
clock moved to the next windows. After every step, for every counter of a
hard limit, ``used`` is at most the larger of the maximum in force plus what
grants paid in its window and ``used`` before the step (a downgrade below the
usage takes nothing back, and lets nothing more in); no hard charge's outcome
is ``overage``; a repeat of a held seat is ``allowed`` with no overage.

The paths: the reference engine, the fast path on its own connections (event
by event, and a step's events as one batch), and `consume` (group commit;
on PostgreSQL the one-trip function first). No step settles an overdraft
(a commit of more than was reserved), the one way past a hard limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from decision_paths import apply_reference, without
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servers import copy_sqlite
from sqlalchemy import select

from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.engine.one_trip import STATS
from metering.storage.tables import counters, results

START = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
LIMITS = [
    Limit("hard", maximum=3, period="1h", window="calendar"),
    Limit("fu", maximum=3, period="30m"),
    Limit("seats", maximum=2, period="1h", window="calendar", distinct="user"),
    Limit(
        "soft_seats",
        maximum=2,
        period="1h",
        window="calendar",
        distinct="user",
        enforcement="soft",
    ),
]
DEFAULTS = {limit.name: limit.maximum for limit in LIMITS}
HARD = {limit.name for limit in LIMITS if limit.enforcement == "hard"}
SEATS = {limit.name for limit in LIMITS if limit.distinct}
SUBJECTS = ["org-1", "org-2"]
# Mostly one subject, so that its usage, entitlements and grants meet often.
subject = st.sampled_from(["org-1", "org-1", "org-1", "org-2"])
limit = st.sampled_from(["hard", "hard", "hard", "fu", "seats", "seats", "soft_seats"])

# An event: its charges and metadata.
charge = st.tuples(subject, st.sampled_from(["hard", "fu"]), st.integers(1, 3)).map(
    lambda c: ([c], None)
)
stacked = st.tuples(subject, st.integers(1, 3)).map(
    lambda c: ([(c[0], "hard", c[1]), (c[0], "fu", 1)], None)
)
seat = st.tuples(subject, st.sampled_from(sorted(SEATS)), st.sampled_from("abc")).map(
    lambda c: ([(c[0], c[1], 1)], {"user": c[2]})
)
events = st.tuples(
    st.just("events"), st.lists(st.one_of(charge, stacked, seat, seat), min_size=1, max_size=4)
)
maximum = st.sampled_from([None, 1, 1, 2, 4])  # lowered, often below the usage
entitle = st.tuples(st.just("entitle"), st.tuples(subject, limit, maximum))
grant = st.tuples(st.just("grant"), st.tuples(subject, limit, st.integers(1, 3)))
advance = st.tuples(st.just("advance"), st.sampled_from([600, 1900, 3600]))
# Weighted: windows outlive several steps.
step = st.sampled_from([events, events, events, entitle, entitle, grant, grant, advance]).flatmap(
    lambda kind: kind
)
steps = st.lists(step, min_size=8, max_size=24)
# Maximum 3, 3 used, lowered to 1, a grant of 1, a charge; the same in seats, and a repeat.
DOWNGRADED = [
    (
        "events",
        [([("org-1", "hard", 3)], None)] + [([("org-1", "seats", 1)], {"user": u}) for u in "ab"],
    ),
    ("entitle", ("org-1", "hard", 1)),
    ("entitle", ("org-1", "seats", 1)),
    ("grant", ("org-1", "hard", 1)),
    ("grant", ("org-1", "seats", 1)),
    ("events", [([("org-1", "hard", 1)], None), ([("org-1", "seats", 1)], {"user": "c"})]),
    ("events", [([("org-1", "seats", 1)], {"user": "a"})]),
]
PATHS = ["reference", "fast", "batch", "consume"]
SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


Key = tuple[str, str, int]  # (limit, subject, window start)
CHARGE_FIELDS = ("subject", "limit", "cost", "allowed", "outcome", "used", "remaining")
CHARGE_FIELDS += ("maximum", "overage")


class Run:
    """One meter on one path, and what the checks need to know."""

    def __init__(self, meter: Meter, path: str, clock: FrozenClock) -> None:
        self.meter, self.path, self.clock = meter, path, clock
        self.maximums: dict[tuple[str, str], int] = {}
        self.ids: list[str] = []  # the last step's event ids
        self.grants = 0
        if path != "consume":
            without(meter._engine, "one_trip")

    def step(self, kind: str, what: Any) -> None:
        if kind == "advance":
            self.clock.advance(seconds=what)
        elif kind == "entitle":
            subject, name, maximum = what
            self.meter.set_entitlement(subject, name, maximum)
            self.maximums[subject, name] = DEFAULTS[name] if maximum is None else maximum
        elif kind == "grant":
            self.grants += 1
            self.meter.grant(what[0], what[1], what[2], grant_id=f"g-{self.grants}")
        else:
            self.apply(what)

    def apply(self, specs: list[tuple[list[tuple[str, str, int]], dict[str, str] | None]]) -> None:
        first = int(self.ids[-1][2:]) + 1 if self.ids else 0
        self.ids = [f"e-{first + n}" for n in range(len(specs))]
        records = [
            make_event(charges, self.clock(), event_id, metadata).record()
            for (charges, metadata), event_id in zip(specs, self.ids, strict=True)
        ]
        engine = self.meter._engine
        if self.path == "batch":
            engine.apply(records, invalid="raise")
        for record in records:
            if self.path == "reference":
                apply_reference(engine, [record], self.meter.database.now_us(), "raise", ())
            elif self.path == "fast":
                engine.apply([record], invalid="raise")
            elif self.path == "consume":
                engine.submit(record)

    def read(self) -> tuple[dict[Key, int], dict[Key, int], list[dict[str, Any]]]:
        """The hard limits' counters, what grants paid per window, the last step's charges."""
        c = counters.c
        used = select(counters.c.limit_name, counters.c.subject, counters.c.window_start_us)
        used = used.add_columns(counters.c.used).where(counters.c.limit_name.in_(HARD))
        drawn = select(c.limit_name, c.subject, c.window_start_us, c.granted).where(c.granted != 0)
        charges = select(results.c.charges).where(results.c.event_id.in_(self.ids))
        with self.meter.sql_engine.connect() as connection:
            return (
                {(r[0], r[1], r[2]): r[3] for r in connection.execute(used)},
                {(r[0], r[1], r[2]): int(r[3]) for r in connection.execute(drawn)},
                [
                    dict(zip(CHARGE_FIELDS, charge, strict=False))
                    for row in connection.execute(charges).scalars()
                    for charge in json.loads(row)
                ],
            )


def _check(run: Run, before: dict[Key, int]) -> dict[Key, int]:
    now, drawn, charges = run.read()
    for key, used in now.items():
        name, subject, _ = key
        maximum = run.maximums.get((subject, name), DEFAULTS[name])
        assert used <= max(maximum + drawn.get(key, 0), before.get(key, 0)), (key, used)
    for charge in charges:
        assert charge["limit"] not in HARD or charge["outcome"] != "overage", charge
        if charge["limit"] in SEATS and charge["cost"] == 0:
            assert (charge["outcome"], charge["overage"]) == ("allowed", 0), charge
    return now


def _play(url: str, path: str, stream: list[tuple[str, Any]]) -> None:
    clock = FrozenClock(START)
    with Meter(url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        run = Run(meter, path, clock)
        before: dict[Key, int] = {}
        for kind, what in stream:
            run.step(kind, what)
            if kind == "events":  # only events change counters
                before = _check(run, before)


@contextmanager
def _database(request: pytest.FixtureRequest, kind: str) -> Iterator[str]:
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        directory: Path = request.getfixturevalue("tmp_path")
        path = directory / f"copy-{next(_copies)}.db"
        try:
            yield copy_sqlite(template, path)
        finally:
            path.unlink()
        return
    server = request.getfixturevalue("postgres_server")
    with server.copy_of(request.getfixturevalue("pg_template_url"), "hard") as url:
        yield url


_copies = iter(range(10**9))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "postgresql"])
def test_a_hard_limit_is_never_passed(request: pytest.FixtureRequest, kind: str, path: str) -> None:
    if kind == "postgresql":
        request.applymarker(pytest.mark.postgres)
    before = STATS.copy()

    @settings(SETTINGS, max_examples=15 if kind == "sqlite" else 6)
    @given(stream=steps)
    @example(stream=DOWNGRADED)
    def prop(stream: list[tuple[str, Any]]) -> None:
        with _database(request, kind) as url:
            _play(url, path, stream)

    prop()
    if kind == "postgresql" and path == "consume":
        assert STATS["applied"] > before["applied"]  # the one-trip function decided some


def test_a_downgraded_subject_with_a_grant_is_denied(db_url: str) -> None:
    """The reproduction: maximum 3, 3 used, lowered to 1, a grant of 1."""
    clock = FrozenClock(START)
    with Meter(db_url, clock=clock) as meter:
        meter.set_limits(LIMITS)
        assert meter.consume("org-1", "hard", cost=3).allowed
        meter.set_entitlement("org-1", "hard", 1)
        meter.grant("org-1", "hard", 1, grant_id="g")
        denied = meter.consume("org-1", "hard")
        assert (denied.outcome, denied.used, denied.remaining) == ("denied", 3, 0)
        assert meter.grants("org-1", "hard")[0].used == 0
        clock.advance(hours=1)
        assert meter.consume("org-1", "hard", cost=2).charges[0].grants == (("g", 1),)
        for user in "abc":
            assert meter.consume("org-1", "seats", metadata={"user": user}).allowed != (user == "c")
        meter.set_entitlement("org-1", "seats", 1)
        meter.grant("org-1", "seats", 1, grant_id="s")
        assert meter.consume("org-1", "seats", metadata={"user": "c"}).outcome == "denied"
        repeat = meter.consume("org-1", "seats", metadata={"user": "a"})
        assert (repeat.outcome, repeat.charges[0].overage, repeat.used) == ("allowed", 0, 2)
