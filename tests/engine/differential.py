"""Helpers of the differential tests: what a database holds, answers as plain values.

`stored` reads every table a decision writes (results, counters, windows,
rollups, notification marks and messages, dead letters, grants and their
draws and schedules, entitlements, seats, reservations, overdrafts,
corrections, resets, time zones, breakers) as sorted tuples, so two databases fed the same stream
compare with ``==``. `answer` and `kind` turn an engine's answers, or the
error it raised, into values to compare. `databases` gives fresh migrated
databases for one Hypothesis example (copies of the session's templates);
`prepared` makes templates of a test's own starting state, and gives copies
of them for each example.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from servers import PostgresServer, copy_sqlite
from sqlalchemy import func, select

from metering import Meter
from metering.domain.decisions import Decision
from metering.domain.forecast import decayed
from metering.domain.limits import Limit
from metering.engine.answers import Answer
from metering.errors import MeteringError
from metering.storage.rollups import ROLLUPS
from metering.storage.tables import (
    breakers,
    corrections,
    counter_resets,
    counters,
    current_windows,
    distinct_values,
    entitlements,
    grant_schedules,
    grants,
    overdrafts,
    rejected_messages,
    reservations,
    results,
    subject_time_zones,
    usage_rollups,
    webhook_marks,
    webhook_messages,
)
from metering.telemetry.metrics import metrics

# Shrinking these streams takes many minutes: a failure is reported as found.
# Windows of every kind, thresholds and dimensions: the tests of paths'
# batches and reservations (a month's end is near).
START = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
SUBJECTS = ["org-1", "org-2", "user-é"]
BATCH_LIMITS = [
    Limit(
        "cal",
        maximum=5,
        period="1h",
        window="calendar",
        thresholds=(50, 100),
        dimensions=("route",),
    ),
    Limit("fu", maximum=4, period="30m"),
    Limit(
        "soft",
        maximum=3,
        period="1mo",
        window="calendar",
        enforcement="soft",
        thresholds=(80,),
        dimensions=("route", "model"),
    ),
    Limit(
        "bucket",
        maximum=3,
        period="60s",
        algorithm="token_bucket",
        thresholds=(100,),
        dimensions=("model",),
    ),
    Limit(
        "shadow",
        maximum=3,
        period="1h",
        window="calendar",
        enforcement="shadow",
        dimensions=("route",),
    ),
    Limit("units", maximum=6, period="30m", thresholds_units=(2, 5, 9)),
]

SETTINGS = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def stored(meter: Meter) -> dict[str, object]:
    """Every table a decision, a settle, a void or a reset writes, sorted."""
    with meter.sql_engine.connect() as connection:

        def rows(query: Any) -> list[tuple[object, ...]]:
            return sorted((tuple(r) for r in connection.execute(query)), key=repr)

        keyed = [ROLLUPS.c[c.name] for c in usage_rollups.primary_key.columns]

        def without(table: Any, *names: str) -> Any:
            return select(*[c for c in table.c if c.name not in names])

        return {
            "results": rows(select(results)),
            # The rates apart (`rates`): a path that leaves an unchanged
            # counter unwritten leaves its rate undecayed; a seat window's stamp is random.
            "counters": rows(
                without(counters, "updated_at_us", "rate", "rate_at_us", "seats_stamp")
            ),
            "windows": rows(select(current_windows)),
            # Summed by key: a batch appends, the reference upserts.
            "rollups": rows(
                select(*keyed, func.sum(ROLLUPS.c.used), func.sum(ROLLUPS.c.events)).group_by(
                    *keyed
                )
            ),
            "marks": rows(without(webhook_marks, "created_at_us")),
            "messages": [
                (kind, _unsigned(payload))
                for kind, payload in rows(
                    select(webhook_messages.c.type, webhook_messages.c.payload)
                )
            ],
            "rejected": rows(select(rejected_messages.c.digest, rejected_messages.c.event_id)),
            "grants": rows(select(grants)),
            "entitlements": rows(select(entitlements)),
            "schedules": rows(select(grant_schedules)),
            "seats": rows(select(distinct_values)),
            "reservations": rows(select(reservations)),
            "overdrafts": rows(select(overdrafts)),
            "corrections": rows(select(corrections)),
            "resets": rows(select(counter_resets)),
            "zones": rows(select(subject_time_zones)),
            "breakers": rows(select(breakers)),
        }


def _unsigned(payload: object) -> object:
    """A payload with its release link's token left out: each database signs
    with a secret of its own (`metering.engine.breakers`)."""
    text = payload.decode() if isinstance(payload, bytes) else payload
    if not isinstance(text, str) or "release_path" not in text:
        return payload
    return re.sub(r"token=[^\"]*", "token=...", text)


def rates(meter: Meter, now_us: int) -> dict[tuple[object, ...], float]:
    """Each counter's rate read at ``now_us`` (`metering.domain.forecast.decayed`)."""
    c = counters.c
    query = select(c.limit_name, c.subject, c.window_start_us, c.rate, c.rate_at_us)
    with meter.sql_engine.connect() as connection:
        return {tuple(r[:3]): decayed(r[3], r[4], now_us) for r in connection.execute(query)}


Found = Any  # what an engine answered, or ("error", type, message)


def answer(ask: Callable[[], Any]) -> Found:
    """What ``ask`` returns, or the `MeteringError` it raised (its type and message)."""
    try:
        return ask()
    except MeteringError as exc:
        return ("error", type(exc).__name__, str(exc))


def kind(found: list[Answer] | tuple[str, str, str]) -> object:
    """An error as it is; answers by kind (new, duplicate, conflict) and outcome."""
    if isinstance(found, tuple):
        return found
    return [(a.kind, None if a.record is None else a.record.outcome) for a in found]


def is_decision(found: Found) -> bool:
    return isinstance(found, Decision)


@contextmanager
def databases(request: pytest.FixtureRequest, kind: str, count: int) -> Iterator[list[str]]:
    """``count`` fresh migrated databases of ``kind`` ("sqlite" or "postgresql")
    for one Hypothesis example, dropped afterwards."""
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        with tempfile.TemporaryDirectory() as directory:
            yield [copy_sqlite(template, Path(directory) / f"{n}.db") for n in range(count)]
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name: str = request.getfixturevalue("pg_template_url")
    with contextlib.ExitStack() as copies:
        yield [copies.enter_context(server.copy_of(name, "diff")) for _ in range(count)]


def reference_events(path: str = "apply") -> float:
    """Events the reference engine decided (``path="apply"``) or checked so far."""
    found = metrics().registry.get_sample_value("metering_reference_events_total", {"path": path})
    return found or 0.0


Copies = Callable[[pytest.FixtureRequest, str, int], AbstractContextManager[list[str]]]


@contextmanager
def prepared(
    request: pytest.FixtureRequest, kind: str, count: int, prepare: Callable[[list[str]], None]
) -> Iterator[Copies]:
    """``count`` fresh databases of ``kind`` brought once to a starting state
    by ``prepare`` (given their URLs; what it opens it closes), kept as
    templates: the function given takes `databases`' arguments and gives
    fresh copies of them for one Hypothesis example (where setting the
    state up in each example cost a third of it)."""
    if kind == "sqlite":
        with databases(request, kind, count) as urls:
            prepare(urls)
            files = [Path(url.removeprefix("sqlite:///")) for url in urls]

            @contextmanager
            def sqlite_copies(_: pytest.FixtureRequest, of: str, n: int) -> Iterator[list[str]]:
                assert (of, n) == (kind, count), "copies of the databases prepared"
                with tempfile.TemporaryDirectory() as directory:
                    yield [copy_sqlite(f, Path(directory) / f.name) for f in files]

            yield sqlite_copies
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name: str = request.getfixturevalue("pg_template_url")
    names = [server.take(name, "prepared") for _ in range(count)]
    try:
        prepare([server.url(n) for n in names])

        @contextmanager
        def pg_copies(_: pytest.FixtureRequest, of: str, n: int) -> Iterator[list[str]]:
            assert (of, n) == (kind, count), "copies of the databases prepared"
            with contextlib.ExitStack() as copies:
                yield [copies.enter_context(server.copy_of(t, "diff")) for t in names]

        yield pg_copies
    finally:
        for template in names:
            server.forget(template)
