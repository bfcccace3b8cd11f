"""Bad input gets one clear error and changes nothing stored (issue 11).

Every case here once ended in a traceback: an integer too large for SQLite,
a datetime that overflows on its way to UTC, a period of 5,000 digits, a
NaN or infinite number of seconds, a NUL byte in a URL. The command line
must print exactly one ``error: ...`` line and exit 1; the Python API must
raise a `MeteringError`; and the database must be as it was.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner

from metering import Limit, Meter
from metering.cli import main
from metering.cli.context import MAX_ERROR_CHARS
from metering.clock import FrozenClock
from metering.errors import (
    InvalidInput,
    InvalidLimit,
    MeteringError,
    OccurredAtOutOfRange,
)
from metering.pipeline.producer import UsageProducer
from metering.reports.overage import select_overage, select_usage
from metering.settings import RetentionPolicy
from metering.upkeep.retention import prune
from metering.webhooks.endpoints import Webhooks

BIG = str(10**20)
DIGITS = "1" * 5000
EARLY = "0001-01-01T00:00:00+01:00"  # before datetime.min once in UTC
LATE = "9999-12-31T23:59:59-01:00"  # after datetime.max once in UTC
ENDPOINT = "{endpoint}"  # replaced by the id of the stored endpoint


def stored(meter: Meter) -> dict[str, Any]:
    """Everything a bad call could have changed."""
    hooks = Webhooks(meter)
    return {
        "limits": [limit.to_dict() for limit in meter.list_limits()],
        "counters": meter.counters(),
        "results": meter.outcome_counts(),
        "rejected": meter.rejected_messages(1000),
        "reservations": meter.reservations(count=1000),
        "endpoints": [endpoint.to_dict() for endpoint in hooks.endpoints()],
        "deliveries": hooks.deliveries(count=1000),
    }


def populate(meter: Meter) -> str:
    """A limit, a consumed event, a held reservation and an endpoint; returns its id."""
    meter.set_limit(Limit("l", maximum=5, period="1m"))
    meter.consume("s", "l", event_id="e-1")
    meter.reserve("s", "l", event_id="r-1")
    endpoint, _secret = Webhooks(meter).add("https://example.com/hook")
    return endpoint.id


# -- the command line ---------------------------------------------------------------

CLI_CASES: list[list[str]] = [
    ["consume", "s", "l", "--at", EARLY],
    ["consume", "s", "l", "--at", LATE],
    ["check", "s", "l", "--at", LATE],
    ["check", "s", "l", "--at", EARLY],
    ["emit", "s", "l", "--at", LATE],
    ["limits", "set", "x", "--max", "1", "--period", DIGITS + "s"],
    ["limits", "set", "x", "--max", "1", "--period", "1s", "--lateness", DIGITS + "s"],
    ["limits", "set", "l", "--max", "1", "--period", "0" * 5000 + "1" * 20 + "mo"],
    ["limits", "set", "x", "--max", "9" * 5000, "--period", "1s"],
    ["consume", "s", "l", "--cost", "9" * 4000],
    ["consume", "s", "l", "--cost", "9" * 5000],
    ["rejected", "--last", BIG],
    ["rejected", "--last", "0"],
    ["reservations", "sweep", "--retention", "inf"],
    ["reservations", "sweep", "--retention", "nan"],
    ["reservations", "sweep", "--retention", "1e300"],
    ["reservations", "list", "--limit", BIG],
    ["webhooks", "rotate", ENDPOINT, "--grace", "nan"],
    ["webhooks", "rotate", ENDPOINT, "--grace", "inf"],
    ["webhooks", "rotate", ENDPOINT, "--grace", "1e300"],
    ["webhooks", "rotate", ENDPOINT, "--grace", "-1"],
    ["webhooks", "deliveries", "--last", BIG],
    ["webhooks", "deliveries", "--last", "-1"],
    ["webhooks", "replay", BIG],
    ["webhooks", "replay", "0"],
    ["webhooks", "replay", "--since", EARLY],
    ["webhooks", "add", "https://exa\x00mple.com/hook"],
    ["webhooks", "add", "https://example.com/ho\x00ok"],
    ["webhooks", "add", "https://example.com/\x1b[31mhook"],
    ["webhooks", "remove", "ep_\x00"],
    ["report", "overage", "--period", "9999-12"],
    ["report", "overage", "--since", EARLY],
    ["report", "overage", "--until", LATE],
    ["report", "overage", "--top", BIG],
    ["report", "usage", "--subject", "s", "--period", "9999-12"],
    ["report", "usage", "--subject", "s", "--since", EARLY],
    ["report", "usage", "--subject", "s", "--until", LATE],
    ["counters", "--subject", "s\x00"],
    ["prune", "--visibility-timeout", "nan"],
    ["prune", "--visibility-timeout", "1e300"],
    ["worker", "--queues", "0"],
    ["worker", "--queues", BIG],
    ["worker", "--concurrency", "-1"],
]


def _case_id(args: list[str]) -> str:
    text = " ".join(a if len(a) < 30 else a[:12] + "…" for a in args)
    return text.replace(BIG, "1e20").encode("unicode_escape").decode()


@pytest.fixture
def cli_url(sqlite_url: str) -> tuple[str, str]:
    url = sqlite_url
    with Meter(url) as meter:
        endpoint_id = populate(meter)
    return url, endpoint_id


@pytest.mark.parametrize("args", CLI_CASES, ids=[_case_id(c) for c in CLI_CASES])
def test_cli_prints_one_error_line_and_changes_nothing(
    cli_url: tuple[str, str], args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, endpoint_id = cli_url
    started: list[object] = []
    monkeypatch.setattr(os, "execve", lambda *a: started.append(a))  # `metering worker`
    monkeypatch.setenv("METERING_BROKER_URL", "memory://")
    with Meter(url) as meter:
        before = stored(meter)
    argv = [endpoint_id if arg == ENDPOINT else arg for arg in args]

    result = CliRunner().invoke(main, ["--database", url, *argv])

    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert len(lines[0]) <= len("error: ") + MAX_ERROR_CHARS, lines[0]
    assert started == []
    with Meter(url) as meter:
        assert stored(meter) == before


# -- the Python API -------------------------------------------------------------------

Call = Callable[[Meter, Webhooks, str], object]
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
PLUS_ONE = timezone(timedelta(hours=1))
MINUS_ONE = timezone(timedelta(hours=-1))
EARLY_AT = datetime(1, 1, 1, tzinfo=PLUS_ONE)
LATE_AT = datetime.max.replace(tzinfo=MINUS_ONE)

API_CASES: list[tuple[str, Call, type[MeteringError]]] = [
    ("period digits", lambda m, h, e: Limit("x", 1, "1" * 5000 + "s"), InvalidLimit),
    ("lateness digits", lambda m, h, e: Limit("x", 1, "1s", lateness=DIGITS + "d"), InvalidLimit),
    ("rotate nan", lambda m, h, e: h.rotate(e, grace_seconds=math.nan), InvalidInput),
    ("rotate inf", lambda m, h, e: h.rotate(e, grace_seconds=math.inf), InvalidInput),
    ("rotate 1e300", lambda m, h, e: h.rotate(e, grace_seconds=1e300), InvalidInput),
    ("rotate bool", lambda m, h, e: h.rotate(e, grace_seconds=True), InvalidInput),
    ("sweep nan", lambda m, h, e: m.sweep_reservations(retention_seconds=math.nan), InvalidInput),
    ("sweep inf", lambda m, h, e: m.sweep_reservations(retention_seconds=math.inf), InvalidInput),
    ("sweep negative", lambda m, h, e: m.sweep_reservations(retention_seconds=-1), InvalidInput),
    ("sweep 1e300", lambda m, h, e: m.sweep_reservations(retention_seconds=1e300), InvalidInput),
    ("reservations count", lambda m, h, e: m.reservations(count=10**20), InvalidInput),
    ("reservations count 0", lambda m, h, e: m.reservations(count=0), InvalidInput),
    ("rejected count", lambda m, h, e: m.rejected_messages(10**20), InvalidInput),
    ("rejected count -1", lambda m, h, e: m.rejected_messages(-1), InvalidInput),
    ("deliveries count", lambda m, h, e: h.deliveries(count=10**20), InvalidInput),
    ("deliveries count -1", lambda m, h, e: h.deliveries(count=-1), InvalidInput),
    ("attempts id", lambda m, h, e: h.attempts(10**20), InvalidInput),
    ("replay id", lambda m, h, e: h.replay([10**20]), InvalidInput),
    ("replay id 0", lambda m, h, e: h.replay([0]), InvalidInput),
    ("replay since", lambda m, h, e: h.replay(since=EARLY_AT), InvalidInput),
    ("url NUL", lambda m, h, e: h.add("https://example.com/\x00"), InvalidInput),
    ("url ESC", lambda m, h, e: h.add("https://example.com/\x1b"), InvalidInput),
    ("url DEL", lambda m, h, e: h.add("https://example.com/\x7f"), InvalidInput),
    ("endpoint NUL", lambda m, h, e: h.remove("ep_\x00"), InvalidInput),
    (
        "consume early",
        lambda m, h, e: m.consume("s", "l", occurred_at=EARLY_AT),
        OccurredAtOutOfRange,
    ),
    (
        "consume late",
        lambda m, h, e: m.consume("s", "l", occurred_at=LATE_AT),
        OccurredAtOutOfRange,
    ),
    ("check late", lambda m, h, e: m.check("s", "l", occurred_at=LATE_AT), OccurredAtOutOfRange),
    ("reserve ttl nan", lambda m, h, e: m.reserve("s", "l", ttl_seconds=math.nan), InvalidInput),
    ("maximum digits", lambda m, h, e: Limit("x", 10**5000, "1s"), InvalidLimit),
    ("cost digits", lambda m, h, e: m.consume("s", "l", cost=10**5000), InvalidInput),
    ("counters subject", lambda m, h, e: m.counters(subject="s\x00"), InvalidInput),
    ("report month", lambda m, h, e: select_overage(m, period="9999-12"), InvalidInput),
    ("report since", lambda m, h, e: select_overage(m, since=EARLY), InvalidInput),
    ("report until", lambda m, h, e: select_usage(m, "s", until=LATE), InvalidInput),
    ("report top", lambda m, h, e: select_overage(m, top=10**20), InvalidInput),
    (
        "prune visibility",
        lambda m, h, e: prune(m, RetentionPolicy(), visibility_timeout_seconds=1e300),
        InvalidInput,
    ),
    (
        "producer interval nan",
        lambda m, h, e: UsageProducer(flush_interval_seconds=math.nan),
        InvalidInput,
    ),
    (
        "producer backoff inf",
        lambda m, h, e: UsageProducer(retry_backoff_seconds=math.inf),
        InvalidInput,
    ),
]


@pytest.fixture
def meter(sqlite_url: str) -> Meter:
    return Meter(sqlite_url, clock=FrozenClock(NOW))


@pytest.mark.parametrize(
    ("call", "error"),
    [pytest.param(call, error, id=name) for name, call, error in API_CASES],
)
def test_api_raises_a_metering_error_and_changes_nothing(
    meter: Meter, call: Call, error: type[MeteringError]
) -> None:
    with meter:
        endpoint_id = populate(meter)
        hooks = Webhooks(meter)
        before = stored(meter)
        with pytest.raises(error):
            call(meter, hooks, endpoint_id)
        assert stored(meter) == before
