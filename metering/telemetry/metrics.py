"""Prometheus metrics: what is counted, the registry, and ``/metrics``.

Counting happens where the services return results, never in the domain:

* `metering.meter.Meter` counts each newly decided event once it is
  committed (`count_events`), whatever path decided it (the worker's
  batches, ``consume``, ``apply``, the HTTP API's ``?wait=decision``);
* `metering.pipeline.batches.apply_batch` times each queued batch;
* `metering.upkeep.dead_letters` counts the events it replays, and those
  of a message never finished that it keeps ``rejected``;
* `metering.storage.connections.run_retry_aware` counts retries and errors;
* `metering.webhooks.delivery.deliver_one` counts delivery attempts;
* the HTTP API counts what it receives (`count_received`) and its requests
  (`HttpMetrics`, installed by `instrument_app`).

Queue depth, the oldest undecided event, the webhook backlog, the input
rejected in the last day and the last audit's violations per invariant are
read when Prometheus scrapes (`LagCollector`, fed by `metering.telemetry.lag`).

Labels never carry a subject: a limit name is the finest label, and at most
`MAX_LIMIT_LABELS` distinct ones are kept per process (more become
``"_other"``), so a flood of unknown names cannot blow up the series count.

**Prefork.** A Celery prefork worker applies batches in child processes
while ``/metrics`` is served by the main one, so the counts of every child
must reach it. prometheus-client's multiprocess mode does that: once
`enable_multiprocess` has pointed ``PROMETHEUS_MULTIPROC_DIR`` at a fresh
directory, every process writes its values to a memory-mapped file of its
own there, and `exposition_registry` sums the files of all processes, dead
ones included (a counter never goes back when a child is replaced).
prometheus-client picks its value class when it is imported, so this
module imports it only when the first metric is made (`metrics`), and
`enable_multiprocess` switches a process that imported it earlier.

Nothing here imports the rest of metering but its errors: the storage layer
counts too (``[tool.importlinter]``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from metering.errors import ConfigurationError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

SourceT = TypeVar("SourceT")

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
# Distinct limit names one process labels; later ones are counted as OTHER_LIMIT.
MAX_LIMIT_LABELS: Final = 1000
OTHER_LIMIT: Final = "_other"
# A rejected event's charge naming no defined limit.
UNKNOWN_LIMIT: Final = "_unknown"
# Requests no route matched (scanners): never the raw path.
UNMATCHED_ROUTE: Final = "_unmatched"
HTTP_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)
# Seconds: a batch of 1,000 events takes tens of milliseconds on PostgreSQL.
BATCH_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
HTTP_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# ASGI's three arguments, and an app taking them.
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Metrics:
    """The metrics of one process (made by `metrics`, once).

    Counting methods take what a batch produced at once, so the hot path
    pays one increment per (limit, outcome) of a batch, not per event.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        # Not prometheus-client's global registry: exposition goes through
        # `exposition_registry`, which reads these or the multiprocess files.
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, documentation: str, *labels: str) -> Counter:
            return Counter(name, documentation, labels, registry=self.registry)

        def histogram(
            name: str, documentation: str, buckets: Sequence[float], *labels: str
        ) -> Histogram:
            return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

        self.events = counter(
            "metering_events",
            "Events decided, once each, under every limit they charge, by the event's outcome.",
            "limit",
            "outcome",
        )
        self.denials = counter(
            "metering_denials", "Denied events, under each limit that denied them.", "limit"
        )
        self.received = counter(
            "metering_events_received",
            "Events the HTTP API accepted, under every limit they charge.",
            "limit",
        )
        self.repeats = counter(
            "metering_events_repeated",
            "Events whose id was decided before: duplicate (same charges) or conflict.",
            "kind",
        )
        self.dead_letters = counter(
            "metering_dead_letters",
            "Queued input kept in rejected_messages (malformed, conflicting ids).",
        )
        self.reference = counter(
            "metering_reference_events",
            "Events the reference engine decided (apply) or checked (check): what the "
            "fast path left to it.",
            "path",
        )
        self.batch_seconds = histogram(
            "metering_batch_apply_seconds",
            "Time to apply one queued batch, retries included.",
            BATCH_BUCKETS,
        )
        self.batch_events = counter(
            "metering_batch_events", "Events in the queued batches applied."
        )
        self.webhook_deliveries = counter(
            "metering_webhook_deliveries",
            "Webhook delivery attempts, by the delivery's state after them.",
            "outcome",
        )
        self.db_retries = counter(
            "metering_db_retries",
            "Transactions run again (conflict, deadlock, busy database, lost connection).",
            "reason",
        )
        self.db_errors = counter(
            "metering_db_errors", "Transactions that failed for good, by the error raised.", "error"
        )
        self.http_requests = counter(
            "metering_http_requests",
            "HTTP requests, by method, route template and status.",
            "method",
            "route",
            "status",
        )
        self.http_seconds = histogram(
            "metering_http_request_duration_seconds",
            "HTTP request duration, by method and route template.",
            HTTP_BUCKETS,
            "method",
            "route",
        )
        self._limits: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def limit_label(self, name: str) -> str:
        """``name``, or `OTHER_LIMIT` once `MAX_LIMIT_LABELS` others were seen."""
        if name in self._limits:
            return name
        with self._lock:
            if len(self._limits) >= MAX_LIMIT_LABELS:
                return OTHER_LIMIT
            self._limits.add(name)
        return name

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def count_events(
        self,
        outcomes: Mapping[tuple[str, str], int],
        denied_by: Mapping[str, int],
        repeats: Mapping[str, int],
        dead_letters: int,
    ) -> None:
        """What one committed transaction decided: (limit, outcome) counts,
        denials by the limit that denied, repeated ids by kind, dead letters."""
        for (limit, outcome), count in outcomes.items():
            self._child(self.events, self.limit_label(limit), outcome).inc(count)
        for limit, count in denied_by.items():
            self._child(self.denials, self.limit_label(limit)).inc(count)
        for kind, count in repeats.items():
            self._child(self.repeats, kind).inc(count)
        if dead_letters:
            self.dead_letters.inc(dead_letters)

    def count_reference(self, path: str, events: int) -> None:
        self._child(self.reference, path).inc(events)

    def count_received(self, limits: Iterable[str]) -> None:
        counts: dict[str, int] = {}
        for name in limits:
            counts[name] = counts.get(name, 0) + 1
        for name, count in counts.items():
            self._child(self.received, self.limit_label(name)).inc(count)

    def observe_batch(self, seconds: float, events: int) -> None:
        self.batch_seconds.observe(seconds)
        self.batch_events.inc(events)

    def count_delivery(self, outcome: str) -> None:
        self._child(self.webhook_deliveries, outcome).inc()

    def count_db_retry(self, reason: str) -> None:
        self._child(self.db_retries, reason).inc()

    def count_db_error(self, error: str) -> None:
        self._child(self.db_errors, error).inc()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "OTHER"
        self._child(self.http_requests, method, route, str(status)).inc()
        self._child(self.http_seconds, method, route).observe(seconds)


_metrics: Metrics | None = None
_build_lock = threading.Lock()


def metrics() -> Metrics:
    """This process's metrics, made on first use (which imports prometheus-client)."""
    made = _metrics
    if made is not None:
        return made
    return _build()


def _build() -> Metrics:
    global _metrics
    with _build_lock:
        if _metrics is None:
            _metrics = Metrics()
        return _metrics


# The calls the rest of metering makes: one line each where they count.


def count_events(
    outcomes: Mapping[tuple[str, str], int],
    denied_by: Mapping[str, int],
    repeats: Mapping[str, int],
    dead_letters: int = 0,
) -> None:
    """See `Metrics.count_events`."""
    if outcomes or denied_by or repeats or dead_letters:
        metrics().count_events(outcomes, denied_by, repeats, dead_letters)


def count_reference(path: str, events: int) -> None:
    """Events the reference engine decided (``path="apply"``) or checked
    (``"check"``): how much the fast path leaves to it."""
    metrics().count_reference(path, events)


def count_received(limits: Iterable[str]) -> None:
    """The HTTP API accepted events: one limit name per event and limit it
    charges (a stacked event charging two limits gives two names)."""
    metrics().count_received(limits)


def observe_batch(seconds: float, events: int) -> None:
    metrics().observe_batch(seconds, events)


def count_delivery(outcome: str) -> None:
    """A webhook delivery attempt, by the delivery's state after it:
    ``delivered``, ``retrying`` or ``failed``."""
    metrics().count_delivery(outcome)


def count_db_retry(reason: str) -> None:
    metrics().count_db_retry(reason)


def count_db_error(error: str) -> None:
    metrics().count_db_error(error)


# -- prefork: prometheus-client's multiprocess mode -----------------------------------


def multiprocess_dir() -> str | None:
    """The multiprocess directory this process writes to, or None."""
    return os.environ.get(MULTIPROC_ENV) or None


def metrics_directory(role: str, pid: int | None = None) -> Path:
    """``$TMPDIR/metering-metrics/<role>-<pid>``: the multiprocess directory of
    one worker or API server, named by its main process."""
    base = Path(tempfile.gettempdir()) / "metering-metrics"
    return base / f"{role}-{os.getpid() if pid is None else pid}"


def enable_multiprocess(directory: str | Path) -> Path:
    """Count in files under ``directory`` (emptied first), summed at scrape time.

    Call it in a parent process before it forks or spawns the processes
    that count (Celery's prefork children, uvicorn's workers): they inherit
    the variable. Values counted in this process before the call are dropped.
    """
    path = Path(directory)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.environ[MULTIPROC_ENV] = str(path)
    global _metrics
    if "prometheus_client.values" in sys.modules:
        from prometheus_client import values

        # prometheus-client chose its value class when it was imported.
        if not getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    with _build_lock:
        _metrics = None
    return path


def mark_process_dead(pid: int | None = None) -> None:
    """A process of the multiprocess directory is gone: drop its live gauges.

    Its counters and histograms stay, so the totals never go back.
    """
    directory = multiprocess_dir()
    if directory is None:
        return
    from prometheus_client import multiprocess

    dead = os.getpid() if pid is None else pid
    multiprocess.mark_process_dead(dead, directory)  # type: ignore[no-untyped-call]


# -- scrape-time gauges ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueLag:
    """What the broker holds: per queue, messages waiting and taken but not
    acknowledged; and the age of the oldest message with an undecided event
    (None: no such message, or none that carries its send time)."""

    depths: tuple[tuple[str, int, int], ...]
    oldest_age_seconds: float | None


@dataclass(frozen=True, slots=True)
class WebhookBacklog:
    """Pending deliveries to enabled endpoints: ``due`` now, ``pending`` in
    all (retries scheduled later included), and how overdue the oldest due one is."""

    due: int
    pending: int
    oldest_due_seconds: float


class LagCollector:
    """Gauges read when Prometheus scrapes: queue depth, the oldest undecided
    event's age, the webhook backlog, what was rejected in the last day and
    the last audit's violations per invariant.

    Each reader is called once per scrape; one that raises is reported as
    ``metering_lag_up{source} 0`` and leaves its gauges out, so a broker
    that is away never fails the scrape of everything else.
    """

    def __init__(
        self,
        queues: Callable[[], QueueLag] | None = None,
        webhooks: Callable[[], WebhookBacklog] | None = None,
        rejected: Callable[[], int] | None = None,
        audit: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.queues = queues
        self.webhooks = webhooks
        self.rejected = rejected
        self.audit = audit

    def describe(self) -> list[Metric]:
        return []  # never queried at registration

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "metering_lag_up", "Whether the last read of a lag source worked.", labels=["source"]
        )
        yield from _source_gauges(up, "broker", self.queues, _queue_gauges)
        yield from _source_gauges(up, "database", self.webhooks, _backlog_gauges)
        yield from _source_gauges(up, "rejected", self.rejected, _rejected_gauges)
        yield from _source_gauges(up, "audit", self.audit, _audit_gauges)
        yield up


def _source_gauges(
    up: Any,
    source: str,
    read: Callable[[], SourceT] | None,
    gauges: Callable[[SourceT], Iterator[Metric]],
) -> Iterator[Metric]:
    """The ``gauges`` of what ``read`` returns (none without a ``read``), and
    under ``up`` whether reading ``source`` worked."""
    if read is None:
        return
    try:
        found = read()
    except Exception:
        up.add_metric([source], 0)
    else:
        up.add_metric([source], 1)
        yield from gauges(found)


def _queue_gauges(lag: QueueLag) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    depth = GaugeMetricFamily(
        "metering_queue_depth",
        "Messages (batches of events) waiting on a queue.",
        labels=["queue"],
    )
    unacked = GaugeMetricFamily(
        "metering_queue_unacked",
        "Messages a worker took from a queue and has not acknowledged yet.",
        labels=["queue"],
    )
    for queue, waiting, taken in lag.depths:
        depth.add_metric([queue], waiting)
        unacked.add_metric([queue], taken)
    yield depth
    yield unacked
    yield GaugeMetricFamily(
        "metering_oldest_undecided_age_seconds",
        "Age of the oldest queued message with an event not decided yet (0: none).",
        value=lag.oldest_age_seconds or 0.0,
    )


def _backlog_gauges(backlog: WebhookBacklog) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily(
        "metering_webhook_backlog",
        "Webhook deliveries due now and not sent yet (enabled endpoints).",
        value=backlog.due,
    )
    yield GaugeMetricFamily(
        "metering_webhook_pending",
        "Webhook deliveries pending, retries scheduled later included.",
        value=backlog.pending,
    )
    yield GaugeMetricFamily(
        "metering_webhook_oldest_due_seconds",
        "How long the most overdue pending delivery has been due (0: none).",
        value=backlog.oldest_due_seconds,
    )


def _rejected_gauges(recent: int) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily(
        "metering_rejected_recent",
        "Rejected events and messages kept in the last day (`metering rejected` lists them).",
        value=recent,
    )


def _audit_gauges(counts: Mapping[str, int]) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    found = GaugeMetricFamily(
        "metering_invariant_violations",
        "Violations the last `metering audit` run found, per invariant (0: none).",
        labels=["invariant"],
    )
    for invariant, count in sorted(counts.items()):
        found.add_metric([invariant], count)
    yield found


class _Own:
    """This process's metrics, in a registry of their own (single-process mode)."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from metrics().registry.collect()


def exposition_registry(collectors: Iterable[Any] = ()) -> CollectorRegistry:
    """What ``/metrics`` shows: every process's values in multiprocess mode
    (`enable_multiprocess`), else this process's; then the scrape-time gauges
    (``collectors``, each a `LagCollector`)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    directory = multiprocess_dir()
    if directory is not None:
        MultiProcessCollector(registry, directory)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Own())
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition(collectors: Iterable[Any] = ()) -> tuple[bytes, str]:
    """The text of ``/metrics`` now, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(exposition_registry(collectors)), CONTENT_TYPE_LATEST


def start_metrics_server(
    port: int, host: str = "0.0.0.0", collectors: Iterable[Any] = ()
) -> Callable[[], None]:
    """Serve `exposition_registry` on ``port`` from a thread (any path, as
    prometheus-client does); returns the function that stops it."""
    from prometheus_client import start_http_server

    registry = exposition_registry(collectors)
    server, thread = start_http_server(port, host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return stop


def metrics_port(env: Mapping[str, str]) -> int | None:
    """``METERING_METRICS_PORT``: the worker's ``/metrics`` port (1-65535); unset, none."""
    raw = (env.get("METERING_METRICS_PORT") or "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 1 <= port <= 65_535:
        raise ConfigurationError(f"METERING_METRICS_PORT must be a port (1-65535), got {raw!r}")
    return port


# -- HTTP: an ASGI app for /metrics, and request metrics --------------------------------


class MetricsApp:
    """An ASGI app answering every GET with the exposition (mount it at ``/metrics``),
    ``collectors`` included (`exposition_registry`).

    A class, not a function, so Starlette's ``Route`` takes it as an ASGI app.
    """

    def __init__(self, collectors: Iterable[Any] = ()) -> None:
        self.collectors = list(collectors)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", "text/plain; charset=utf-8")
            return
        # Reading the files (or the broker) blocks: not on the event loop.
        import anyio.to_thread

        body, content_type = await anyio.to_thread.run_sync(exposition, self.collectors)
        await _respond(send, 200, b"" if scope["method"] == "HEAD" else body, content_type)

    async def response(self) -> Any:
        """The exposition as a Starlette response (a FastAPI route's endpoint)."""
        import anyio.to_thread
        from starlette.responses import Response

        body, content_type = await anyio.to_thread.run_sync(exposition, self.collectors)
        return Response(body, media_type=content_type)


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def metrics_asgi_app(collectors: Iterable[Any] = ()) -> MetricsApp:
    """The ASGI app of ``/metrics`` (`exposition_registry` at each request)."""
    return MetricsApp(collectors)


class HttpMetrics:
    """ASGI middleware counting requests by method, route template and status.

    The route is the template Starlette/FastAPI matched (``scope["route"]``,
    e.g. ``/v1/events/{event_id}``), `UNMATCHED_ROUTE` when none did: raw
    paths would give a series per event id. An exception counts as 500.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        began = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED_ROUTE
            metrics().observe_request(
                scope.get("method", "GET"), route, status, time.perf_counter() - began
            )


def instrument_app(
    app: Any,
    path: str = "/metrics",
    collectors: Iterable[Any] = (),
    dependencies: Sequence[Any] = (),
) -> None:
    """Count ``app``'s requests (`HttpMetrics`) and serve ``path`` from it,
    with the scrape-time ``collectors`` (`metering.telemetry.lag.lag_collector`).

    ``app`` is a Starlette or FastAPI application, before it starts; call it
    after adding the other middleware, so requests they answer are counted
    too. The route is left out of FastAPI's OpenAPI schema. ``dependencies``
    (FastAPI only) guard the route: the API's ``METERING_METRICS_SCOPE``.
    """
    from starlette.routing import Route

    if not hasattr(app, "add_middleware") or not hasattr(app, "router"):
        raise ConfigurationError("instrument_app needs a Starlette or FastAPI application")
    app.add_middleware(HttpMetrics)
    endpoint = metrics_asgi_app(collectors)
    if hasattr(app, "add_api_route"):  # FastAPI: its router names only its own routes
        app.add_api_route(
            path,
            endpoint.response,
            methods=["GET"],
            include_in_schema=False,
            dependencies=list(dependencies),
        )
    else:
        app.router.routes.append(Route(path, endpoint=endpoint, methods=["GET", "HEAD"]))
