"""`Settings`: every ``METERING_*`` variable the workers use, read once.

``Settings.from_env()`` reads and checks them all when a worker (or beat)
starts, so a bad value stops it with one `ConfigurationError` naming the
variable, before any message is taken. Every variable is optional:

* ``METERING_DATABASE_URL``: counters and results (default ``sqlite:///metering.db``).
* ``METERING_BROKER_URL``: Redis in production; unset, the embedded broker.
* ``METERING_QUEUES``: how many hash-routed queues producers use (1 to 1024, default 1).
* ``METERING_VISIBILITY_TIMEOUT``: seconds before a message a dead worker
  took is delivered again (default 300).
* ``METERING_WEBHOOKS_INTERVAL``: seconds between beat's webhook runs and
  ``limit.reset`` sweeps (default 5).
* ``METERING_WEBHOOKS_POLL_INTERVAL``: seconds between a worker's looks for
  due deliveries (default 0.25); ``METERING_WEBHOOKS_DISPATCH=0`` leaves
  delivery to beat; the other ``METERING_WEBHOOKS_*`` in `DeliverySettings`.
* ``METERING_RESERVATION_SWEEP_INTERVAL``: seconds between sweeps of
  reservations past their time to live (default 10).
* ``METERING_RESERVATION_RETENTION``: seconds settled reservations are kept
  (default a week).
* ``METERING_PRUNE_INTERVAL``: seconds between retention runs (default
  3600); ages in ``METERING_RETAIN_*_DAYS`` (`RetentionPolicy`).
* ``METERING_METRICS_PORT``: a worker serves Prometheus ``/metrics`` on
  this port (1-65535), from its main process; unset, it serves none
  (`metering.metrics`, ``docs/metrics.md``).
* ``METERING_LOG_FORMAT``: ``text`` (default) or ``json``, one object per line.
* ``METERING_TRACING``: ``otlp`` traces over OpenTelemetry (the ``tracing``
  extra), as does a set ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``off`` never.
* ``METERING_API_MAX_BODY_BYTES``, ``METERING_API_MAX_EVENTS``: the HTTP
  API's bounds on one request body (default 1 MiB) and on the events in one
  request (default 1000); past either, 413.
* ``METERING_API_AUTH``: ``auto`` (default: API keys are asked for once one
  exists) or ``required`` (always); ``METERING_API_RATE``: each API key's
  requests, ``N/PERIOD`` (default ``6000/1m``) or ``off`` (docs/api-auth.md).
* ``METERING_METRICS_SCOPE``: unset (default), the API's ``/metrics`` is open
  to anyone who reaches the port; ``read`` (or ``admin``), it asks for a key
  of that scope.
* ``METERING_CORRECTION_HORIZON_DAYS``: how far back an event can be voided
  (default 35 days; `Meter.void`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from metering.apikeys import (
    DEFAULT_API_RATE,
    ApiRate,
    AuthMode,
    Scope,
    api_rate,
    auth_mode,
    metrics_scope,
)
from metering.config import (
    DEFAULT_BROKER_URL,
    DEFAULT_CORRECTION_HORIZON_DAYS,
    DEFAULT_DATABASE_URL,
    correction_horizon_days,
    env_float,
    queue_count,
)
from metering.domain.bounds import MAX_LISTING
from metering.errors import ConfigurationError
from metering.logs import log_format
from metering.metrics import metrics_port
from metering.retention import RetentionPolicy
from metering.tracing import tracing_enabled
from metering.webhooks.settings import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_POLL_SECONDS,
    DeliverySettings,
    dispatching,
)

DEFAULT_VISIBILITY_TIMEOUT_SECONDS: Final = 300.0
DEFAULT_RESERVATION_SWEEP_SECONDS: Final = 10.0
DEFAULT_RESERVATION_RETENTION_SECONDS: Final = 7 * 86_400.0
DEFAULT_PRUNE_INTERVAL_SECONDS: Final = 3600.0
DEFAULT_API_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_API_MAX_EVENTS: Final = 1000
# A body bound past this is no bound at all (the API buffers one body).
MAX_API_BODY_BYTES: Final = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """What a worker and beat run with. Build it with `from_env`, or by hand in tests."""

    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = DEFAULT_BROKER_URL
    queues: int = 1
    visibility_timeout_seconds: float = DEFAULT_VISIBILITY_TIMEOUT_SECONDS
    webhooks_interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    webhooks_poll_seconds: float = DEFAULT_POLL_SECONDS
    webhooks_dispatch: bool = True
    reservation_sweep_seconds: float = DEFAULT_RESERVATION_SWEEP_SECONDS
    reservation_retention_seconds: float = DEFAULT_RESERVATION_RETENTION_SECONDS
    prune_interval_seconds: float = DEFAULT_PRUNE_INTERVAL_SECONDS
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    api_max_body_bytes: int = DEFAULT_API_MAX_BODY_BYTES
    api_max_events: int = DEFAULT_API_MAX_EVENTS
    metrics_port: int | None = None
    log_format: str = "text"
    tracing: bool = False
    api_auth: AuthMode = "auto"
    api_rate: ApiRate | None = DEFAULT_API_RATE
    correction_horizon_days: int = DEFAULT_CORRECTION_HORIZON_DAYS
    metrics_scope: Scope | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Every setting from ``environ`` (default ``os.environ``); `ConfigurationError`
        names the first variable that is not valid."""
        env = os.environ if environ is None else environ

        def seconds(name: str, default: float) -> float:
            return env_float(name, default, env)

        return cls(
            database_url=env.get("METERING_DATABASE_URL") or DEFAULT_DATABASE_URL,
            broker_url=env.get("METERING_BROKER_URL") or DEFAULT_BROKER_URL,
            queues=queue_count(env),
            visibility_timeout_seconds=seconds(
                "METERING_VISIBILITY_TIMEOUT", DEFAULT_VISIBILITY_TIMEOUT_SECONDS
            ),
            webhooks_interval_seconds=seconds(
                "METERING_WEBHOOKS_INTERVAL", DEFAULT_INTERVAL_SECONDS
            ),
            webhooks_poll_seconds=seconds("METERING_WEBHOOKS_POLL_INTERVAL", DEFAULT_POLL_SECONDS),
            webhooks_dispatch=dispatching(env),
            reservation_sweep_seconds=seconds(
                "METERING_RESERVATION_SWEEP_INTERVAL", DEFAULT_RESERVATION_SWEEP_SECONDS
            ),
            reservation_retention_seconds=seconds(
                "METERING_RESERVATION_RETENTION", DEFAULT_RESERVATION_RETENTION_SECONDS
            ),
            prune_interval_seconds=seconds(
                "METERING_PRUNE_INTERVAL", DEFAULT_PRUNE_INTERVAL_SECONDS
            ),
            retention=RetentionPolicy.from_environment(env),
            delivery=DeliverySettings.from_env(env),
            api_max_body_bytes=_whole(
                env, "METERING_API_MAX_BODY_BYTES", DEFAULT_API_MAX_BODY_BYTES, MAX_API_BODY_BYTES
            ),
            api_max_events=_whole(
                env, "METERING_API_MAX_EVENTS", DEFAULT_API_MAX_EVENTS, MAX_LISTING
            ),
            metrics_port=metrics_port(env),
            log_format=log_format(env),
            tracing=tracing_enabled(env),
            api_auth=auth_mode(env),
            api_rate=api_rate(env),
            correction_horizon_days=correction_horizon_days(env),
            metrics_scope=metrics_scope(env),
        )


def _whole(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    """A whole number from 1 to ``maximum`` from ``env``, else ``default``."""
    value = env_float(name, default, env)
    if value != int(value) or not 1 <= value <= maximum:
        raise ConfigurationError(f"{name} must be a whole number from 1 to {maximum}")
    return int(value)
