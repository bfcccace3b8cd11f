"""Metrics without servers: what `Meter` counts, the exposition, the guards.

Counters are per process, and other tests of this process count too, so
each test reads the exposition before and after and compares the
difference, on limit names of its own. Multiprocess mode runs in child
processes (`test_multiprocess_mode_sums_every_process`): it switches the
process that enables it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from metering import Limit, Meter, make_event
from metering.errors import ConfigurationError, EventConflict, StorageError
from metering.pipeline.batches import apply_batch
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.routing import APPLY_BATCH_TASK
from metering.storage.connections import RetryTransaction, make_engine, run_transaction
from metering.storage.kombu_tables import Unfinished
from metering.telemetry.logs import log_format
from metering.telemetry.metrics import (
    MAX_LIMIT_LABELS,
    OTHER_LIMIT,
    UNKNOWN_LIMIT,
    UNMATCHED_ROUTE,
    LagCollector,
    Metrics,
    QueueLag,
    WebhookBacklog,
    exposition,
    exposition_registry,
    instrument_app,
    metrics_port,
)
from metering.telemetry.tracing import tracing_enabled
from metering.upkeep.dead_letters import keep_unfinished

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape() -> Samples:
    body, _ = exposition()
    return parse(body.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("mt_hard", maximum=3, period="1d", window="calendar"))
        meter.set_limit(Limit("mt_soft", maximum=2, period="1d", enforcement="soft"))
        yield meter


def test_meter_counts_each_new_decision_once_by_limit_and_outcome(meter: Meter) -> None:
    before = scrape()
    for _ in range(5):  # 3 allowed, 2 denied
        meter.consume("org-1", "mt_hard")
    for _ in range(3):  # 2 allowed, then over the soft maximum
        meter.consume("org-1", "mt_soft")
    # A stacked event denied by one limit: denied under both, a denial of one.
    meter.consume(charges=[("org-2", "mt_soft", 1), ("org-1", "mt_hard", 1)])
    # Repeats are not decisions.
    meter.consume("org-3", "mt_soft", event_id="same")
    meter.consume("org-3", "mt_soft", event_id="same")
    with pytest.raises(EventConflict):
        meter.consume("org-3", "mt_soft", cost=2, event_id="same")
    after = scrape()

    events = "metering_events_total"
    assert delta(before, after, events, limit="mt_hard", outcome="allowed") == 3
    assert delta(before, after, events, limit="mt_hard", outcome="denied") == 3
    assert delta(before, after, events, limit="mt_soft", outcome="allowed") == 3
    assert delta(before, after, events, limit="mt_soft", outcome="overage") == 1
    assert delta(before, after, events, limit="mt_soft", outcome="denied") == 1
    assert delta(before, after, "metering_denials_total", limit="mt_hard") == 3
    assert delta(before, after, "metering_denials_total", limit="mt_soft") == 0
    repeats = "metering_events_repeated_total"
    assert delta(before, after, repeats, kind="duplicate") == 1
    assert delta(before, after, repeats, kind="conflict") == 1


def test_rejected_events_name_no_unknown_limit(meter: Meter) -> None:
    before = scrape()
    now = meter.clock()
    meter.apply(
        [
            make_event([("org-1", "mt_no_such_limit", 1)], now),
            make_event([("org-1", "mt_hard", 1)], now + timedelta(days=3)),  # in the future
        ]
    )
    after = scrape()
    events = "metering_events_total"
    assert delta(before, after, events, limit=UNKNOWN_LIMIT, outcome="rejected") == 1
    assert delta(before, after, events, limit="mt_hard", outcome="rejected") == 1
    assert not any(labels and ("limit", "mt_no_such_limit") in labels for _, labels in after)


def test_queued_batches_are_timed_and_dead_letters_counted(meter: Meter) -> None:
    before = scrape()
    now = datetime.now(UTC)
    good = [encode_event(make_event([(f"org-{i}", "mt_hard", 1)], now)) for i in range(4)]
    apply_batch(meter, encode_batch([*good, {"id": "broken"}]))
    apply_batch(meter, "not a batch")
    after = scrape()
    assert delta(before, after, "metering_batch_apply_seconds_count") == 2
    assert delta(before, after, "metering_batch_events_total") == 5 + 1
    assert delta(before, after, "metering_dead_letters_total") == 2
    assert delta(before, after, "metering_events_total", limit="mt_hard", outcome="allowed") == 4


def test_limit_labels_are_bounded() -> None:
    metrics = Metrics()
    names = [f"limit-{i}" for i in range(MAX_LIMIT_LABELS + 5)]
    metrics.count_events({(name, "allowed"): 1 for name in names}, {}, {}, 0)
    samples = parse(generate_latest(metrics.registry).decode())
    limits = {
        dict(labels)["limit"]
        for (name, labels) in samples
        if name == "metering_events_total" and labels
    }
    assert len(limits) == MAX_LIMIT_LABELS + 1
    assert value(samples, "metering_events_total", limit=OTHER_LIMIT, outcome="allowed") == 5


def test_http_requests_are_counted_by_route_template() -> None:
    def item(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.path_params["item_id"])

    def boom(_request: Request) -> PlainTextResponse:
        raise RuntimeError("boom")

    app = Starlette(routes=[Route("/mt/items/{item_id}", item), Route("/mt/boom", boom)])
    instrument_app(app)
    before = scrape()

    async def requests() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for item_id in ("a", "b", "c"):
                assert (await client.get(f"/mt/items/{item_id}")).status_code == 200
            assert (await client.get("/mt/nowhere/12345")).status_code == 404
            assert (await client.get("/mt/boom")).status_code == 500
            return await client.get("/metrics")

    scraped = asyncio.run(requests())
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    after = parse(scraped.text)
    counted = "metering_http_requests_total"
    template = "/mt/items/{item_id}"
    assert delta(before, after, counted, method="GET", route=template, status="200") == 3
    assert delta(before, after, counted, method="GET", route=UNMATCHED_ROUTE, status="404") == 1
    assert delta(before, after, counted, method="GET", route="/mt/boom", status="500") == 1
    duration = "metering_http_request_duration_seconds_count"
    assert delta(before, after, duration, method="GET", route=template) == 3
    assert not any(("route", "/mt/items/a") in labels for _, labels in after)


def test_lag_gauges_are_read_at_scrape_time_and_a_failing_source_is_reported() -> None:
    def queues() -> QueueLag:
        return QueueLag((("metering", 7, 2), ("metering.0", 1, 0)), 12.5)

    def broken() -> WebhookBacklog:
        raise OSError("database away")

    registry = exposition_registry([LagCollector(queues, broken)])
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "metering_queue_depth", queue="metering") == 7
    assert value(samples, "metering_queue_unacked", queue="metering") == 2
    assert value(samples, "metering_queue_depth", queue="metering.0") == 1
    assert value(samples, "metering_oldest_undecided_age_seconds") == 12.5
    assert value(samples, "metering_lag_up", source="broker") == 1
    assert value(samples, "metering_lag_up", source="database") == 0
    assert ("metering_webhook_backlog", frozenset()) not in samples

    def backlog() -> WebhookBacklog:
        return WebhookBacklog(3, 5, 40.0)

    samples = parse(generate_latest(exposition_registry([LagCollector(None, backlog)])).decode())
    assert value(samples, "metering_webhook_backlog") == 3
    assert value(samples, "metering_webhook_pending") == 5
    assert value(samples, "metering_webhook_oldest_due_seconds") == 40


def _count_in_child(times: int) -> None:
    from metering.telemetry.metrics import count_events

    for _ in range(times):
        count_events({("mp_limit", "allowed"): 1}, {"mp_limit": 1}, {})


_PARENT = """
import multiprocessing, sys
from metering.telemetry import metrics
metrics.count_events({("mp_limit", "allowed"): 100}, {}, {})  # before: dropped
metrics.enable_multiprocess(sys.argv[1])
metrics.count_events({("mp_limit", "allowed"): 1}, {}, {})  # the parent's own
sys.path.insert(0, sys.argv[2])
from test_metrics import _count_in_child
context = multiprocessing.get_context("fork")
children = [context.Process(target=_count_in_child, args=(n,)) for n in (3, 5, 7)]
for child in children:
    child.start()
for child in children:
    child.join()
    metrics.mark_process_dead(child.pid)
body, _ = metrics.exposition()
print(body.decode())
"""


@pytest.mark.slow
def test_multiprocess_mode_sums_every_process(tmp_path: Path) -> None:
    directory = tmp_path / "mp"
    directory.mkdir()
    (directory / "stale_123.db").write_text("left by a process of an earlier run")
    done = subprocess.run(
        [sys.executable, "-c", _PARENT, str(directory), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )
    assert done.returncode == 0, done.stderr
    samples = parse(done.stdout)
    assert value(samples, "metering_events_total", limit="mp_limit", outcome="allowed") == 16
    assert value(samples, "metering_denials_total", limit="mp_limit") == 15
    assert not (directory / "stale_123.db").exists()


@pytest.mark.slow
def test_metering_import_does_not_import_prometheus_client_or_kombu() -> None:
    # Every `metering` command imports `Meter`: kombu's SQL transport (and the
    # ORM it brings) cost each one about 0.4 s of CPU, for the worker's use only.
    code = (
        "import sys, metering.meter, metering.telemetry.metrics;"
        " print(sorted({m.split('.')[0] for m in sys.modules} & {'prometheus_client', 'kombu'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- configuration -----------------------------------------------------------------


def test_metrics_port_is_validated() -> None:
    assert metrics_port({}) is None
    assert metrics_port({"METERING_METRICS_PORT": " "}) is None
    assert metrics_port({"METERING_METRICS_PORT": "9108"}) == 9108
    for bad in ("0", "65536", "http", "9.5", "-1"):
        with pytest.raises(ConfigurationError, match="METERING_METRICS_PORT"):
            metrics_port({"METERING_METRICS_PORT": bad})


def test_log_format_and_tracing_are_validated() -> None:
    assert log_format({}) == "text"
    assert log_format({"METERING_LOG_FORMAT": "JSON"}) == "json"
    with pytest.raises(ConfigurationError, match="METERING_LOG_FORMAT"):
        log_format({"METERING_LOG_FORMAT": "xml"})
    assert not tracing_enabled({})
    assert tracing_enabled({"METERING_TRACING": "otlp"})
    assert tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing_enabled(
        {"METERING_TRACING": "off", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    )
    with pytest.raises(ConfigurationError, match="METERING_TRACING"):
        tracing_enabled({"METERING_TRACING": "jaeger"})


def test_settings_read_the_observability_variables() -> None:
    from metering.settings import Settings

    default = Settings.from_env({})
    assert (default.metrics_port, default.log_format, default.tracing) == (None, "text", False)
    settings = Settings.from_env(
        {"METERING_METRICS_PORT": "9108", "METERING_LOG_FORMAT": "json", "METERING_TRACING": "otlp"}
    )
    assert (settings.metrics_port, settings.log_format, settings.tracing) == (9108, "json", True)
    with pytest.raises(ConfigurationError, match="METERING_METRICS_PORT"):
        Settings.from_env({"METERING_METRICS_PORT": "nine"})


def test_database_retries_and_failures_are_counted(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    runs: list[int] = []

    def conflicting(connection: Connection) -> int:
        runs.append(1)
        if len(runs) < 3:
            raise RetryTransaction("try again")
        return len(runs)

    def broken(connection: Connection) -> None:
        connection.execute(text("SELECT * FROM no_such_table"))

    def hopeless(connection: Connection) -> None:
        raise RetryTransaction("never")

    try:
        before = scrape()
        assert run_transaction(engine, conflicting) == 3
        with pytest.raises(StorageError) as failed:
            run_transaction(engine, broken)
        with pytest.raises(StorageError, match="gave up"):
            run_transaction(engine, hopeless, attempts=2)
        after = scrape()
    finally:
        engine.dispose()
    retries = "metering_db_retries_total"
    assert delta(before, after, retries, reason="requested") == 2 + 1
    errors = "metering_db_errors_total"
    assert type(failed.value).__name__ == "DatabaseUnavailable"  # SQLite's OperationalError
    assert delta(before, after, errors, error="DatabaseUnavailable") == 1
    assert delta(before, after, errors, error="StorageError") == 1  # gave up


def test_events_a_broker_gave_up_on_count_as_rejected(meter: Meter) -> None:
    """`keep_unfinished` (a message delivered too many times) counts the events
    it rejects as the engine counts rejected ones, and its other dead letters."""
    now = datetime.now(UTC)
    decided = make_event([("org-1", "mt_soft", 1)], now)
    meter.apply([decided])
    events = [
        make_event([("org-1", "mt_hard", 1)], now),
        make_event([("org-1", "mt_hard", 1), ("org-1", "mt_soft", 1)], now),
        make_event([("org-1", "mt_gone", 1)], now),
    ]
    batch = encode_batch([*map(encode_event, [*events, decided]), {"id": "broken"}])
    before = scrape()
    kept = keep_unfinished(meter.database, [Unfinished("{}", 5, APPLY_BATCH_TASK, batch)])
    after = scrape()
    assert kept == 3
    rejected = "metering_events_total"
    assert delta(before, after, rejected, limit="mt_hard", outcome="rejected") == 2
    assert delta(before, after, rejected, limit="mt_soft", outcome="rejected") == 1
    assert delta(before, after, rejected, limit=UNKNOWN_LIMIT, outcome="rejected") == 1
    assert delta(before, after, "metering_dead_letters_total") == 1  # the broken event
