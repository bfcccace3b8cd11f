"""`Settings`: every ``METERING_*`` variable, and the one module that reads the environment.

``Settings.from_env()`` reads and checks them all from one mapping when a
worker (or beat, or ``metering serve``) starts, so a bad value stops it with
one `ConfigurationError` naming the variable, before any message is taken;
each part is handed its own settings (the URLs, `DeliverySettings`,
`RetentionPolicy`, the API's bounds and keys, the correction horizon, the
``OTEL_*`` variables for tracing). No other module reads ``os.environ``
(tests/unit/test_settings.py greps for it): a library entry point used
without an explicit value (``Meter()``, ``UsageProducer()``, `SecretBox`,
the command line) asks this module for its one part (`database_url`,
`broker_url`, `queue_count`, `secret_keys`, `data_home` ...), read and
checked here. Every variable is optional:

* ``METERING_DATABASE_URL``: counters and results (default ``sqlite:///metering.db``).
* ``METERING_DB_CONNECTIONS``: the most PostgreSQL connections one process
  opens, all its paths together (default 10, at least 3; docs/operations.md sizes it).
* ``METERING_BROKER_URL``: Redis in production; unset, the embedded broker.
* ``METERING_QUEUES``: how many hash-routed queues producers use (1 to 1024, default 1).
* ``METERING_VISIBILITY_TIMEOUT``: seconds before a message a dead worker
  took is delivered again (default 300).
* ``METERING_BROKER_MAX_DELIVERIES``: deliveries of a message that never
  finishes, on Redis and the embedded broker, before it is kept as a dead
  letter (default 5).
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
* ``METERING_AUDIT_INTERVAL``: seconds between beat's runs of `metering.upkeep.audit`
  (default 3600); each checks only what the ledger took since the last.
* ``METERING_METRICS_PORT``: a worker serves Prometheus ``/metrics`` on
  this port (1-65535), from its main process; unset, it serves none
  (`metering.telemetry.metrics`, ``docs/metrics.md``).
* ``METERING_LOG_FORMAT``: ``text`` (default) or ``json``, one object per line.
* ``METERING_TRACING``: ``otlp`` traces over OpenTelemetry (the ``tracing``
  extra), as does a set ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``off`` never.
* ``METERING_API_MAX_BODY_BYTES``, ``METERING_API_MAX_EVENTS``: the HTTP
  API's bounds on one request body (default 1 MiB) and on the events in one
  request (default 1000); past either, 413.
* ``METERING_API_BODY_TIMEOUT``: seconds the HTTP API waits for a request's
  whole body (default 30; a streamed import: for each part of it); past
  them, 408 and the connection closed.
* ``METERING_API_RETRY_BACKOFF``: seconds the API waits before its first
  retry of a broker that did not take a request's events (default 0.2,
  doubled each retry up to 5 s, five tries; then the 503 that keeps them).
* ``METERING_API_AUTH``: ``auto`` (default: API keys are asked for once one
  exists) or ``required`` (always); ``METERING_API_RATE``: each API key's
  requests, ``N/PERIOD`` (default ``6000/1m``) or ``off`` (docs/api-auth.md).
* ``METERING_METRICS_SCOPE``: unset (default), the API's ``/metrics`` is open
  to anyone who reaches the port; ``read`` (or ``admin``), it asks for a key
  of that scope.
* ``METERING_CORRECTION_HORIZON_DAYS``: how far back an event can be voided
  (default 35 days; `Meter.void`).
* ``METERING_SQLITE_SYNCHRONOUS``: ``NORMAL`` (default) or ``FULL``.
* ``METERING_SECRET_KEY``, ``METERING_WEBHOOKS_ROTATION_GRACE``: webhook
  secrets at rest and the grace of a rotated one (docs/webhooks.md).
* ``METERING_PUBLIC_URL``: where receivers and customers reach ``metering
  serve`` (``https://metering.example.com``, http or https, no query);
  webhooks then carry absolute links (``release_url``) and ``metering
  portal link`` makes its links under it. Unset: links stay relative.
* ``METERING_HOME``: the command line's own files (default ./.metering).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from metering.domain.bounds import MAX_LISTING, shown
from metering.domain.limits import MAX_MAXIMUM, parse_period
from metering.domain.links import public_url_problem
from metering.errors import ConfigurationError, InvalidInput, InvalidLimit
from metering.pipeline.routing import MAX_QUEUES
from metering.telemetry.logs import log_format
from metering.telemetry.metrics import metrics_port
from metering.telemetry.tracing import tracing_enabled

Environ = Mapping[str, str]


def _environ(environ: Environ | None) -> Environ:
    """``environ``, else this process's environment: the one place it is read."""
    return os.environ if environ is None else environ


def child_environment(**overrides: str) -> dict[str, str]:
    """A copy of this process's environment with ``overrides``, for a child
    process (the worker ``metering worker`` starts, the demo's worker)."""
    return {**os.environ, **overrides}


def export_to_children(**values: str) -> None:
    """Set variables in this process's environment, for processes it starts
    that read their own `Settings` (``metering serve``'s uvicorn workers)."""
    os.environ.update(values)


# -- numbers ---------------------------------------------------------------------------


def env_float(name: str, default: float, environ: Environ | None = None) -> float:
    """A positive number from the environment (or ``environ``), with a clear error
    when it is not one."""
    text = _environ(environ).get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name}={text!r} must be a positive, finite number")
    return value


def _whole(env: Environ, name: str, default: int, maximum: int) -> int:
    """A whole number from 1 to ``maximum`` from ``env``, else ``default``."""
    value = env_float(name, default, env)
    if value != int(value) or not 1 <= value <= maximum:
        raise ConfigurationError(f"{name} must be a whole number from 1 to {maximum}")
    return int(value)


# -- database and broker ---------------------------------------------------------------

DEFAULT_DATABASE_URL: Final = "sqlite:///metering.db"
# Kombu's SQLAlchemy transport on a SQLite file: a broker with no server that
# several processes on one machine share.
DEFAULT_BROKER_URL: Final = "sqla+sqlite:///metering-broker.db"
SQLITE_SYNCHRONOUS_VALUES: Final = ("NORMAL", "FULL")


def database_url(explicit: str | None = None, environ: Environ | None = None) -> str:
    """The database URL: the argument, else ``METERING_DATABASE_URL``, else ./metering.db."""
    return explicit or _environ(environ).get("METERING_DATABASE_URL") or DEFAULT_DATABASE_URL


# A thread holds one connection at a time: ten serve the threads of a
# typical server process (waitress's 4, a worker's few) with room for the
# book of leases' threads and its listener.
DEFAULT_DB_CONNECTIONS: Final = 10
# One for SQLAlchemy's pool, one for the hot path, one for the leases' listener.
MIN_DB_CONNECTIONS: Final = 3
MAX_DB_CONNECTIONS: Final = 1000


def db_connections(environ: Environ | None = None) -> int:
    """``METERING_DB_CONNECTIONS``: the most PostgreSQL connections one process
    opens, every path's together (default 10; 3 to 1000)."""
    text = _environ(environ).get("METERING_DB_CONNECTIONS")
    return DEFAULT_DB_CONNECTIONS if text is None else connection_budget(text)


def connection_budget(value: object, name: str = "METERING_DB_CONNECTIONS") -> int:
    """A connection budget, a whole number from 3 to 1000 (`ConfigurationError` else)."""
    try:
        number = int(str(value)) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not MIN_DB_CONNECTIONS <= number <= MAX_DB_CONNECTIONS:
        raise ConfigurationError(
            f"{name} must be a whole number from {MIN_DB_CONNECTIONS} to {MAX_DB_CONNECTIONS}"
        )
    return number


def broker_url(explicit: str | None = None, environ: Environ | None = None) -> str:
    """The broker URL: the argument, else ``METERING_BROKER_URL``, else the embedded one."""
    return explicit or _environ(environ).get("METERING_BROKER_URL") or DEFAULT_BROKER_URL


def producer_database_url(
    explicit: str | None, broker: str, environ: Environ | None = None
) -> str | None:
    """The database whose limits a producer checks: the argument, else
    ``METERING_DATABASE_URL``, else with the embedded default broker the
    default database (./metering.db, where its workers apply); else None (a
    broker only: nothing to check against)."""
    found = explicit or _environ(environ).get("METERING_DATABASE_URL")
    if found:
        return found
    return DEFAULT_DATABASE_URL if broker == DEFAULT_BROKER_URL else None


def queue_count(environ: Environ | None = None) -> int:
    """``METERING_QUEUES``: how many hash-routed queues producers use and
    workers consume (a whole number from 1 to `MAX_QUEUES`, default 1)."""
    wanted = env_float("METERING_QUEUES", 1, environ)
    if wanted != int(wanted) or not 1 <= wanted <= MAX_QUEUES:
        raise ConfigurationError(f"METERING_QUEUES must be a whole number from 1 to {MAX_QUEUES}")
    return int(wanted)


DEFAULT_CORRECTION_HORIZON_DAYS: Final = 35
MAX_CORRECTION_HORIZON_DAYS: Final = 3650


def correction_horizon_days(environ: Environ | None = None) -> int:
    """``METERING_CORRECTION_HORIZON_DAYS``: how far back `Meter.void` reaches
    (1 to 3650 days, default 35)."""
    name = "METERING_CORRECTION_HORIZON_DAYS"
    value = env_float(name, DEFAULT_CORRECTION_HORIZON_DAYS, environ)
    if value != int(value) or not 1 <= value <= MAX_CORRECTION_HORIZON_DAYS:
        raise ConfigurationError(
            f"{name} must be a whole number of days from 1 to {MAX_CORRECTION_HORIZON_DAYS}"
        )
    return int(value)


def sqlite_synchronous(environ: Environ | None = None) -> str:
    """``METERING_SQLITE_SYNCHRONOUS``: ``NORMAL`` (default) or ``FULL``.

    Both run SQLite in WAL mode. ``NORMAL`` syncs the log at checkpoints, not
    at every commit: a killed process loses nothing, a power cut or kernel
    crash may lose the last commits. ``FULL`` syncs every commit (about
    0.2 ms each here) and survives both.
    """
    value = _environ(environ).get("METERING_SQLITE_SYNCHRONOUS", "NORMAL").strip().upper()
    if value not in SQLITE_SYNCHRONOUS_VALUES:
        raise ConfigurationError(
            f"METERING_SQLITE_SYNCHRONOUS must be NORMAL or FULL, got {value!r}"
        )
    return value


def data_home(environ: Environ | None = None) -> str | None:
    """``METERING_HOME``: where the command line keeps its own files (unset: None)."""
    return _environ(environ).get("METERING_HOME") or None


def public_url(environ: Environ | None = None) -> str | None:
    """``METERING_PUBLIC_URL`` without a trailing ``/`` (unset: None): the base
    of the links the server hands out; `ConfigurationError` when it cannot be one."""
    text = (_environ(environ).get("METERING_PUBLIC_URL") or "").strip()
    return checked_public_url(text) if text else None


def checked_public_url(url: str, name: str = "METERING_PUBLIC_URL") -> str:
    """``url`` as a public URL, without a trailing ``/``; `ConfigurationError` else."""
    problem = public_url_problem(url)
    if problem is not None:
        raise ConfigurationError(f"{name}={shown(url)} {problem}")
    return url.rstrip("/")


def otel_variables(environ: Environ | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables, for `metering.telemetry.tracing.setup_tracing`."""
    return {k: v for k, v in _environ(environ).items() if k.startswith("OTEL_")}


# -- webhooks --------------------------------------------------------------------------

# Seconds to wait after each failed attempt: 10 attempts over about 3 days.
DEFAULT_SCHEDULE: Final = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 50400.0, 72000.0, 86400.0)
DEFAULT_TIMEOUT_SECONDS: Final = 15.0
DEFAULT_INTERVAL_SECONDS: Final = 5.0
# A worker looks for due deliveries this often (one indexed claim when idle).
DEFAULT_POLL_SECONDS: Final = 0.25
DEFAULT_MAX_IN_FLIGHT: Final = 16
DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT: Final = 4
DEFAULT_ROTATION_GRACE_SECONDS: Final = 86400.0
SECRET_KEY_VARIABLE: Final = "METERING_SECRET_KEY"
# A claim outlives one attempt by this much before another worker may take it.
LEASE_MARGIN_SECONDS: Final = 30.0


def parse_schedule(text: str) -> tuple[float, ...]:
    """``5,300,1800``: seconds after each failed attempt (at least one, all positive)."""
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigurationError(
            f"METERING_WEBHOOKS_SCHEDULE={text!r}: use seconds separated by commas"
        ) from None
    if not delays or any(delay <= 0 for delay in delays):
        raise ConfigurationError(
            f"METERING_WEBHOOKS_SCHEDULE={text!r}: give at least one positive delay"
        )
    return delays


def parse_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``10.20.0.0/16,fd00::/8``: networks deliveries may reach although not public."""
    try:
        return tuple(ipaddress.ip_network(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise ConfigurationError(
            f"METERING_WEBHOOKS_ALLOW_NETWORKS={text!r}: {exc} (use networks such as "
            "10.20.0.0/16, separated by commas)"
        ) from None


@dataclass(frozen=True, slots=True)
class WebhookProxy:
    """An HTTP proxy deliveries tunnel through (``METERING_WEBHOOKS_PROXY``)."""

    host: str
    port: int
    # ``Basic ...`` when the URL carries a user; never shown.
    authorization: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_proxy(text: str) -> WebhookProxy | None:
    """``http://[user:password@]host[:port]`` (port 80 by default); empty: none."""
    import base64
    from urllib.parse import unquote, urlsplit

    text = text.strip()
    if not text:
        return None
    name = "METERING_WEBHOOKS_PROXY"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigurationError(
            f"{name} must be an http:// URL with a host (such as http://proxy.internal:3128)"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigurationError(f"{name} must name a proxy, with no path or query")
    authorization = None
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user.encode()).decode("ascii")
    return WebhookProxy(parts.hostname, 80 if port is None else port, authorization)


def _flag(name: str, environ: Environ) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """How deliveries are made. `from_env` reads the ``METERING_WEBHOOKS_*`` variables."""

    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    schedule_seconds: tuple[float, ...] = DEFAULT_SCHEDULE
    allow_private: bool = False
    max_per_run: int = 100
    # Attempts running at once in one process, and at most this many per
    # endpoint: a slow receiver holds its own slots, never another's.
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_per_endpoint: int = DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT
    # Networks let through although not public (a receiver on a private network).
    allowed_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # The server's public URL: payloads' signed paths also go as absolute URLs.
    public_url: str | None = None
    # Deliveries go through this proxy, as tunnels to the checked address.
    proxy: WebhookProxy | None = None

    def __post_init__(self) -> None:
        if self.public_url is not None:
            object.__setattr__(
                self, "public_url", checked_public_url(self.public_url, "public_url")
            )

    @property
    def lease_seconds(self) -> float:
        return self.timeout_seconds + LEASE_MARGIN_SECONDS

    @classmethod
    def from_env(cls, environ: Environ | None = None) -> DeliverySettings:
        env = _environ(environ)
        schedule = env.get("METERING_WEBHOOKS_SCHEDULE", "").strip()
        return cls(
            timeout_seconds=env_float("METERING_WEBHOOKS_TIMEOUT", DEFAULT_TIMEOUT_SECONDS, env),
            schedule_seconds=parse_schedule(schedule) if schedule else DEFAULT_SCHEDULE,
            allow_private=_flag("METERING_WEBHOOKS_ALLOW_PRIVATE", env),
            allowed_networks=parse_networks(env.get("METERING_WEBHOOKS_ALLOW_NETWORKS", "")),
            max_in_flight=_count("METERING_WEBHOOKS_CONCURRENCY", DEFAULT_MAX_IN_FLIGHT, env),
            max_in_flight_per_endpoint=_count(
                "METERING_WEBHOOKS_PER_ENDPOINT", DEFAULT_MAX_IN_FLIGHT_PER_ENDPOINT, env
            ),
            public_url=public_url(env),
            proxy=parse_proxy(env.get("METERING_WEBHOOKS_PROXY", "")),
        )


def _count(name: str, default: int, environ: Environ) -> int:
    value = env_float(name, default, environ)
    if value != int(value):
        raise ConfigurationError(f"{name}={value:g} must be a whole number")
    return int(value)


def poll_seconds(environ: Environ | None = None) -> float:
    """How often a worker's dispatcher looks for due deliveries
    (``METERING_WEBHOOKS_POLL_INTERVAL``, default 0.25)."""
    return env_float("METERING_WEBHOOKS_POLL_INTERVAL", DEFAULT_POLL_SECONDS, environ)


def dispatching(environ: Environ | None = None) -> bool:
    """Whether workers deliver from a thread of their own (``METERING_WEBHOOKS_DISPATCH``,
    default on; ``0`` leaves delivery to beat's ``metering.deliver_webhooks``)."""
    text = _environ(environ).get("METERING_WEBHOOKS_DISPATCH", "").strip().lower()
    return text not in ("0", "false", "no", "off")


def rotation_grace_seconds(environ: Environ | None = None) -> float:
    return env_float("METERING_WEBHOOKS_ROTATION_GRACE", DEFAULT_ROTATION_GRACE_SECONDS, environ)


def secret_keys(environ: Environ | None = None) -> tuple[str, ...]:
    """The Fernet keys of ``METERING_SECRET_KEY`` (comma-separated, newest first);
    empty when it is unset. They are checked where they are used (`SecretBox`)."""
    text = _environ(environ).get(SECRET_KEY_VARIABLE, "")
    return tuple(part.strip() for part in text.split(",") if part.strip())


# -- retention -------------------------------------------------------------------------

DAY_US: Final = 86_400 * 1_000_000
MAX_DAYS: Final = 100 * 366


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Ages, in days, after which rows go; ``None`` keeps a table for ever
    (`metering.upkeep.retention`)."""

    results_days: float | None = 400.0
    rejected_days: float | None = 90.0
    webhooks_days: float | None = 30.0

    def __post_init__(self) -> None:
        for name in ("results_days", "rejected_days", "webhooks_days"):
            value = getattr(self, name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 < value <= MAX_DAYS
            ):
                raise InvalidInput(name, f"must be a number of days in (0, {MAX_DAYS}]")

    @classmethod
    def from_environment(cls, environ: Environ | None = None) -> RetentionPolicy:
        """``METERING_RETAIN_RESULTS_DAYS``, ``METERING_RETAIN_REJECTED_DAYS`` and
        ``METERING_RETAIN_WEBHOOKS_DAYS``; ``never`` keeps a table for ever."""
        defaults = cls()
        env = _environ(environ)

        def days(name: str, default: float | None) -> float | None:
            if env.get(name, "").strip().lower() == "never":
                return None
            return env_float(name, default, env) if default is not None else None

        try:
            return cls(
                days("METERING_RETAIN_RESULTS_DAYS", defaults.results_days),
                days("METERING_RETAIN_REJECTED_DAYS", defaults.rejected_days),
                days("METERING_RETAIN_WEBHOOKS_DAYS", defaults.webhooks_days),
            )
        except InvalidInput as exc:
            raise ConfigurationError(f"retention: {exc}") from None

    def age_us(self, table: str) -> int | None:
        days = {
            "results": self.results_days,
            "corrections": self.results_days,  # they go with the results they correct
            "counter_resets": self.results_days,
            "usage_rollups": self.results_days,
            "rejected_messages": self.rejected_days,
        }.get(table, self.webhooks_days)
        return None if days is None else round(days * DAY_US)


# -- the HTTP API's keys ---------------------------------------------------------------

# A key's scope, and how the HTTP API asks for keys (METERING_API_AUTH).
Scope = Literal["ingest", "read", "admin"]
AuthMode = Literal["auto", "required"]
AUTH_MODES: Final[tuple[AuthMode, ...]] = ("auto", "required")


def auth_mode(environ: Environ) -> AuthMode:
    """``METERING_API_AUTH``: ``auto`` (default) or ``required``.

    ``auto`` asks for a key as soon as one was ever created (until then the
    API answers everyone, so a first ``metering serve`` works); ``required``
    asks always (a deployment: no key yet, every request is 401).
    """
    value = (environ.get("METERING_API_AUTH") or "auto").strip().lower()
    if value not in AUTH_MODES:
        raise ConfigurationError(f"METERING_API_AUTH must be auto or required, got {shown(value)}")
    return value


# What METERING_METRICS_SCOPE may ask of a scraper's key.
METRICS_SCOPES: Final[tuple[Scope, ...]] = ("read", "admin")


def metrics_scope(environ: Environ) -> Scope | None:
    """``METERING_METRICS_SCOPE``: unset (default), the API's ``/metrics`` is open
    to whoever reaches the port; ``read`` or ``admin``, it asks for a key of
    that scope, whether or not the rest of the API asks for keys yet."""
    value = (environ.get("METERING_METRICS_SCOPE") or "").strip().lower()
    if not value:
        return None
    if value not in METRICS_SCOPES:
        raise ConfigurationError(
            f"METERING_METRICS_SCOPE must be read or admin (or unset: open), got {shown(value)}"
        )
    return value


@dataclass(frozen=True, slots=True)
class ApiRate:
    """The API's own limit per key: ``maximum`` requests per ``period`` (a token bucket)."""

    maximum: int
    period: str

    def __str__(self) -> str:
        return f"{self.maximum}/{self.period}"


# The API's own limit per key (METERING_API_RATE), unless "off".
DEFAULT_API_RATE: Final = ApiRate(6000, "1m")


def parse_rate(text: str, *, name: str = "METERING_API_RATE") -> ApiRate | None:
    """``N/PERIOD`` (``600/1m``, ``100/1s``, ``10000/1h``), or ``off`` (None)."""
    value = text.strip().lower()
    if value == "off":
        return None
    count, slash, period = value.partition("/")
    problem = f"{name} must be N/PERIOD like 600/1m, or off; got {shown(text)}"
    if not slash or not count.strip().isdigit() or len(count.strip()) > 16:
        raise ConfigurationError(problem)
    maximum = int(count)
    if not 1 <= maximum <= MAX_MAXIMUM:
        raise ConfigurationError(f"{name}: N must be from 1 to {MAX_MAXIMUM}; got {shown(text)}")
    try:
        parsed = parse_period(period.strip(), field_name=name)
    except InvalidLimit as exc:
        raise ConfigurationError(f"{name}: {exc.message}") from None
    if parsed.is_calendar_months:
        raise ConfigurationError(f"{name}: the period must be in s, m, h, d or w; got {text!r}")
    return ApiRate(maximum, str(parsed))


def api_rate(environ: Environ) -> ApiRate | None:
    """``METERING_API_RATE`` (default ``6000/1m``), or None when ``off``."""
    return parse_rate(environ.get("METERING_API_RATE") or str(DEFAULT_API_RATE))


# -- everything ------------------------------------------------------------------------

DEFAULT_VISIBILITY_TIMEOUT_SECONDS: Final = 300.0
DEFAULT_BROKER_MAX_DELIVERIES: Final = 5
MAX_BROKER_MAX_DELIVERIES: Final = 1000
DEFAULT_RESERVATION_SWEEP_SECONDS: Final = 10.0
DEFAULT_RESERVATION_RETENTION_SECONDS: Final = 7 * 86_400.0
DEFAULT_PRUNE_INTERVAL_SECONDS: Final = 3600.0
DEFAULT_AUDIT_INTERVAL_SECONDS: Final = 3600.0
DEFAULT_API_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_API_BODY_TIMEOUT_SECONDS: Final = 30.0
DEFAULT_API_MAX_EVENTS: Final = 1000
DEFAULT_API_RETRY_BACKOFF_SECONDS: Final = 0.2
# A body bound past this is no bound at all (the API buffers one body).
MAX_API_BODY_BYTES: Final = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """What a worker and beat run with. Build it with `from_env`, or by hand in tests."""

    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = DEFAULT_BROKER_URL
    queues: int = 1
    visibility_timeout_seconds: float = DEFAULT_VISIBILITY_TIMEOUT_SECONDS
    broker_max_deliveries: int = DEFAULT_BROKER_MAX_DELIVERIES
    webhooks_interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    webhooks_poll_seconds: float = DEFAULT_POLL_SECONDS
    webhooks_dispatch: bool = True
    reservation_sweep_seconds: float = DEFAULT_RESERVATION_SWEEP_SECONDS
    reservation_retention_seconds: float = DEFAULT_RESERVATION_RETENTION_SECONDS
    prune_interval_seconds: float = DEFAULT_PRUNE_INTERVAL_SECONDS
    audit_interval_seconds: float = DEFAULT_AUDIT_INTERVAL_SECONDS
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    api_max_body_bytes: int = DEFAULT_API_MAX_BODY_BYTES
    api_body_timeout_seconds: float = DEFAULT_API_BODY_TIMEOUT_SECONDS
    api_max_events: int = DEFAULT_API_MAX_EVENTS
    api_retry_backoff_seconds: float = DEFAULT_API_RETRY_BACKOFF_SECONDS
    metrics_port: int | None = None
    log_format: str = "text"
    tracing: bool = False
    api_auth: AuthMode = "auto"
    api_rate: ApiRate | None = DEFAULT_API_RATE
    correction_horizon_days: int = DEFAULT_CORRECTION_HORIZON_DAYS
    metrics_scope: Scope | None = None
    # METERING_PUBLIC_URL: the base of the links the server hands out (None: relative).
    public_url: str | None = None
    # The OTEL_* variables, for `metering.telemetry.tracing.setup_tracing`.
    otel: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls, environ: Environ | None = None) -> Settings:
        """Every setting from ``environ`` (default ``os.environ``); `ConfigurationError`
        names the first variable that is not valid."""
        env = _environ(environ)
        # Read where they are used (the storage engine, `rotate`); checked here
        # too, so that a worker or server with a bad one stops as it starts.
        sqlite_synchronous(env)
        db_connections(env)
        rotation_grace_seconds(env)

        def seconds(name: str, default: float) -> float:
            return env_float(name, default, env)

        return cls(
            database_url=database_url(None, env),
            broker_url=broker_url(None, env),
            queues=queue_count(env),
            visibility_timeout_seconds=seconds(
                "METERING_VISIBILITY_TIMEOUT", DEFAULT_VISIBILITY_TIMEOUT_SECONDS
            ),
            broker_max_deliveries=_whole(
                env,
                "METERING_BROKER_MAX_DELIVERIES",
                DEFAULT_BROKER_MAX_DELIVERIES,
                MAX_BROKER_MAX_DELIVERIES,
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
            audit_interval_seconds=seconds(
                "METERING_AUDIT_INTERVAL", DEFAULT_AUDIT_INTERVAL_SECONDS
            ),
            retention=RetentionPolicy.from_environment(env),
            delivery=DeliverySettings.from_env(env),
            api_max_body_bytes=_whole(
                env, "METERING_API_MAX_BODY_BYTES", DEFAULT_API_MAX_BODY_BYTES, MAX_API_BODY_BYTES
            ),
            api_body_timeout_seconds=seconds(
                "METERING_API_BODY_TIMEOUT", DEFAULT_API_BODY_TIMEOUT_SECONDS
            ),
            api_max_events=_whole(
                env, "METERING_API_MAX_EVENTS", DEFAULT_API_MAX_EVENTS, MAX_LISTING
            ),
            api_retry_backoff_seconds=seconds(
                "METERING_API_RETRY_BACKOFF", DEFAULT_API_RETRY_BACKOFF_SECONDS
            ),
            metrics_port=metrics_port(env),
            log_format=log_format(env),
            tracing=tracing_enabled(env),
            api_auth=auth_mode(env),
            api_rate=api_rate(env),
            correction_horizon_days=correction_horizon_days(env),
            metrics_scope=metrics_scope(env),
            public_url=public_url(env),
            otel=tuple(sorted(otel_variables(env).items())),
        )
