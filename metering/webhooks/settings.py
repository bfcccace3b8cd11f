"""Webhook settings from the environment (every one optional)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from metering.config import env_float
from metering.errors import ConfigurationError

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


def _flag(name: str, environ: Mapping[str, str]) -> bool:
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

    @property
    def lease_seconds(self) -> float:
        return self.timeout_seconds + LEASE_MARGIN_SECONDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeliverySettings:
        env = os.environ if environ is None else environ
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
        )


def _count(name: str, default: int, environ: Mapping[str, str]) -> int:
    value = env_float(name, default, environ)
    if value != int(value):
        raise ConfigurationError(f"{name}={value:g} must be a whole number")
    return int(value)


def poll_seconds() -> float:
    """How often a worker's dispatcher looks for due deliveries
    (``METERING_WEBHOOKS_POLL_INTERVAL``, default 0.25)."""
    return env_float("METERING_WEBHOOKS_POLL_INTERVAL", DEFAULT_POLL_SECONDS)


def dispatching(environ: Mapping[str, str] | None = None) -> bool:
    """Whether workers deliver from a thread of their own (``METERING_WEBHOOKS_DISPATCH``,
    default on; ``0`` leaves delivery to beat's ``metering.deliver_webhooks``)."""
    env = os.environ if environ is None else environ
    text = env.get("METERING_WEBHOOKS_DISPATCH", "").strip().lower()
    return text not in ("0", "false", "no", "off")


def rotation_grace_seconds() -> float:
    return env_float("METERING_WEBHOOKS_ROTATION_GRACE", DEFAULT_ROTATION_GRACE_SECONDS)


def secret_keys() -> tuple[str, ...]:
    """The Fernet keys of ``METERING_SECRET_KEY`` (comma-separated, newest first);
    empty when it is unset. They are checked where they are used (`SecretBox`)."""
    text = os.environ.get(SECRET_KEY_VARIABLE, "")
    return tuple(part.strip() for part in text.split(",") if part.strip())
