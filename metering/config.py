"""Configuration: environment variables and limits files.

Every variable is optional; with none set everything runs on files in the
working directory.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from metering.domain.limits import Limit
from metering.errors import ConfigurationError, InvalidLimit
from metering.routing import MAX_QUEUES

DEFAULT_DATABASE_URL: Final = "sqlite:///metering.db"
# Kombu's SQLAlchemy transport on a SQLite file: a broker with no server that
# several processes on one machine share.
DEFAULT_BROKER_URL: Final = "sqla+sqlite:///metering-broker.db"
# kombu's SQLAlchemy transport, made safe for processes that start together.
EMBEDDED_TRANSPORT: Final = "metering.storage.broker:EmbeddedTransport"


def use_embedded_transport() -> None:
    """Make ``sqla+`` broker URLs use `EMBEDDED_TRANSPORT` in this process.

    kombu takes the transport from a URL's prefix before any setting, so the
    prefix itself is pointed at ours (kombu looks aliases up on each connect).
    """
    from kombu.transport import TRANSPORT_ALIASES

    for prefix in ("sqla", "sqlalchemy"):
        TRANSPORT_ALIASES[prefix] = EMBEDDED_TRANSPORT


def database_url(explicit: str | None = None) -> str:
    """The database URL: the argument, else ``METERING_DATABASE_URL``, else ./metering.db."""
    return explicit or os.environ.get("METERING_DATABASE_URL") or DEFAULT_DATABASE_URL


def broker_url(explicit: str | None = None) -> str:
    """The broker URL: the argument, else ``METERING_BROKER_URL``, else the embedded one."""
    return explicit or os.environ.get("METERING_BROKER_URL") or DEFAULT_BROKER_URL


def is_embedded_broker(url: str) -> bool:
    return url.startswith(("sqla+sqlite:", "sqlalchemy+sqlite:"))


def env_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A positive number from the environment (or ``environ``), with a clear error
    when it is not one."""
    text = (os.environ if environ is None else environ).get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name}={text!r} must be a positive, finite number")
    return value


def queue_count(environ: Mapping[str, str] | None = None) -> int:
    """``METERING_QUEUES``: how many hash-routed queues producers use and
    workers consume (a whole number from 1 to `MAX_QUEUES`, default 1)."""
    wanted = env_float("METERING_QUEUES", 1, environ)
    if wanted != int(wanted) or not 1 <= wanted <= MAX_QUEUES:
        raise ConfigurationError(f"METERING_QUEUES must be a whole number from 1 to {MAX_QUEUES}")
    return int(wanted)


DEFAULT_CORRECTION_HORIZON_DAYS: Final = 35
MAX_CORRECTION_HORIZON_DAYS: Final = 3650


def correction_horizon_days(environ: Mapping[str, str] | None = None) -> int:
    """``METERING_CORRECTION_HORIZON_DAYS``: how far back `Meter.void` reaches
    (1 to 3650 days, default 35)."""
    name = "METERING_CORRECTION_HORIZON_DAYS"
    value = env_float(name, DEFAULT_CORRECTION_HORIZON_DAYS, environ)
    if value != int(value) or not 1 <= value <= MAX_CORRECTION_HORIZON_DAYS:
        raise ConfigurationError(
            f"{name} must be a whole number of days from 1 to {MAX_CORRECTION_HORIZON_DAYS}"
        )
    return int(value)


def load_limits_file(path: str | Path) -> list[Limit]:
    """Read limits from a YAML (.yaml/.yml) or TOML (.toml) file.

    Either form works: a mapping of name to fields (optionally under a
    top-level ``limits`` key), or a list of entries that each have a ``name``.
    Every entry is validated before any is returned.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise ConfigurationError(f"{path}: use a .yaml, .yml or .toml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    if isinstance(data, Mapping) and "limits" in data:
        data = data["limits"]
    return _limits_from(data, path)


def _limits_from(data: Any, path: Path) -> list[Limit]:
    entries: list[tuple[str | None, Any]]
    if isinstance(data, Mapping):
        entries = [(str(name), fields) for name, fields in data.items()]
    elif isinstance(data, list):
        entries = [(None, fields) for fields in data]
    else:
        raise ConfigurationError(f"{path}: expected a mapping or a list of limits")
    found: list[Limit] = []
    for name, fields in entries:
        if not isinstance(fields, Mapping):
            raise ConfigurationError(f"{path}: limit {name or '?'} is not a mapping of fields")
        try:
            found.append(Limit.from_dict(fields, name=name))
        except (InvalidLimit, TypeError) as exc:
            raise InvalidLimit("limits file", f"{path}: limit {name or '?'}: {exc}") from exc
    names = [limit.name for limit in found]
    if len(set(names)) != len(names):
        raise InvalidLimit("limits file", f"{path}: a limit is defined twice")
    return found
