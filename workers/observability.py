"""Glue: a worker's ``/metrics``, JSON logs and tracing.

* ``METERING_METRICS_PORT`` set: as the worker starts (Celery's
  ``celeryd_init``, in the main process, before the pool forks), metrics
  switch to prometheus-client's multiprocess mode in a directory of this
  worker, ``$TMPDIR/metering-metrics/worker-<pid>``, emptied first. Every
  pool process inherits it and counts in files of its own there; the
  `MetricsServer` bootstep serves their sum, with the lag gauges, from the
  main process only, once the pool is up. A pool process that exits is
  marked dead (``worker_process_shutdown``); a warm shutdown removes the
  directory. A port that cannot be listened on is logged, and the worker
  goes on without ``/metrics``.
* Every handler Celery sets up redacts the secrets of URLs in what it
  writes (`metering.telemetry.logs.RedactSecrets`): httpx logs each webhook POST's URL.
* ``METERING_LOG_FORMAT=json``: the handlers Celery sets up (root, task and
  billiard loggers, in the worker and in beat) format with `metering.telemetry.logs.JsonFormatter`,
  and records logged inside a task carry its ``task_id`` and ``task_name``.
  Celery's banner and its shutdown notices are printed, not logged
  (``celery --quiet`` leaves the banner out).
* ``METERING_TRACING=otlp`` (or an ``OTEL_EXPORTER_OTLP_ENDPOINT``): tracing
  is set up in the main process before the pool forks (the SDK restarts its
  export thread in each child), see `metering.telemetry.tracing`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from celery import bootsteps, signals

from metering.settings import Settings
from metering.telemetry.lag import lag_collector
from metering.telemetry.logs import redact_handlers, use_json
from metering.telemetry.metrics import (
    enable_multiprocess,
    mark_process_dead,
    metrics_directory,
    start_metrics_server,
)
from metering.telemetry.tracing import setup_tracing
from workers.settings import settings_of

log = logging.getLogger(__name__)
_state: dict[str, Any] = {"directory": None, "tracing": None}


def _current_settings() -> Settings | None:
    from celery import current_app

    try:
        return settings_of(current_app)
    except AttributeError:  # an app not made by workers.app.create_app
        return None


def _worker_starting(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """The worker's main process, before its pool exists."""
    try:
        settings = settings_of(instance.app)
    except AttributeError:  # a worker of another Celery app in this process
        return
    if settings.metrics_port is not None:
        _state["directory"] = enable_multiprocess(metrics_directory("worker"))
    if settings.tracing and _state["tracing"] is None:
        _state["tracing"] = setup_tracing("metering-worker", env=dict(settings.otel))


def _pool_process_exiting(pid: int | None = None, **_: Any) -> None:
    mark_process_dead(pid)


def _worker_stopped(**_: Any) -> None:
    directory = _state["directory"]
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
        _state["directory"] = None
    tracing = _state["tracing"]
    if tracing is not None:
        tracing.provider.shutdown()  # flush what is left
        _state["tracing"] = None


class TaskFields(logging.Filter):
    """Adds ``task_id`` and ``task_name`` to records logged inside a task, and
    drops the arguments from Celery's ``data`` field (a whole batch, with its
    metadata, that the text format never shows)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery import current_task

        data = getattr(record, "data", None)
        if isinstance(data, dict) and ("args" in data or "kwargs" in data):
            record.data = {k: v for k, v in data.items() if k not in ("args", "kwargs")}
        task = current_task
        if task is not None and getattr(task, "request", None) is not None:
            task_id = getattr(task.request, "id", None)
            if task_id is not None:
                record.task_id = task_id
                record.task_name = task.name
        return True


# Celery's loggers of a task received, succeeded, and sent by beat.
TASK_LOGGERS: Final = ("celery.worker.strategy", "celery.app.trace", "celery.beat")


class PeriodicAtDebug(logging.Filter):
    """Logs Celery's lines about the periodic ``tasks`` (received, succeeded,
    sent by beat) at DEBUG, not INFO: a worker at INFO would otherwise write
    several lines a minute that say nothing happened."""

    def __init__(self, tasks: Collection[str]) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not self._periodic(record.args):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True

    def _periodic(self, args: object) -> bool:
        if isinstance(args, Mapping):
            return args.get("name") in self.tasks
        return isinstance(args, tuple) and any(arg in self.tasks for arg in args)


def log_periodic_at_debug(tasks: Collection[str]) -> None:
    """Install `PeriodicAtDebug` for ``tasks`` on Celery's task loggers (once)."""
    for name in TASK_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, PeriodicAtDebug)]:
            logger.removeFilter(old)
        logger.addFilter(PeriodicAtDebug(tasks))


def _set_up_handlers(logger: logging.Logger | None) -> None:
    """Redaction on every handler of ``logger``; JSON too when asked for."""
    if logger is not None:
        redact_handlers(logger)  # no URL's password in any line (httpx logs URLs)
    settings = _current_settings()
    if settings is None or settings.log_format != "json" or logger is None:
        return
    use_json(logger)
    for handler in logger.handlers:
        if not any(isinstance(f, TaskFields) for f in handler.filters):
            handler.addFilter(TaskFields())


def _root_logger_ready(logger: logging.Logger | None = None, **_: Any) -> None:
    from celery.utils.log import get_multiprocessing_logger

    _set_up_handlers(logger)
    # Celery gives billiard's logger (the pool's "process exited" lines,
    # which does not propagate) handlers of its own.
    _set_up_handlers(get_multiprocessing_logger())


def _task_logger_ready(logger: logging.Logger | None = None, **_: Any) -> None:
    _set_up_handlers(logger)


class MetricsServer(bootsteps.StartStopStep):  # type: ignore[misc]
    """Serves ``/metrics`` from the worker's main process (``METERING_METRICS_PORT``)."""

    label = "metrics server"
    # After the pool: the HTTP thread is never in a forked child.
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.stop_server: Callable[[], None] | None = None

    def include_if(self, parent: Any) -> bool:
        return settings_of(parent.app).metrics_port is not None

    def start(self, parent: Any) -> None:
        settings = settings_of(parent.app)
        port = settings.metrics_port
        assert port is not None
        lag = lag_collector(settings.database_url, settings.broker_url, settings.queues)
        try:
            self.stop_server = start_metrics_server(port, collectors=[lag])
        except OSError as exc:
            log.error("metrics: cannot serve /metrics on port %s: %s", port, exc)
            return
        log.info("metrics served on port %s (/metrics)", port)

    def stop(self, parent: Any) -> None:
        if self.stop_server is not None:
            self.stop_server()
            self.stop_server = None


# Connected once, when the Celery app is made (`workers.app` imports this);
# strong references: these functions live as long as the module anyway.
signals.celeryd_init.connect(_worker_starting, weak=False)
signals.worker_process_shutdown.connect(_pool_process_exiting, weak=False)
signals.worker_shutdown.connect(_worker_stopped, weak=False)
signals.after_setup_logger.connect(_root_logger_ready, weak=False)
signals.after_setup_task_logger.connect(_task_logger_ready, weak=False)
