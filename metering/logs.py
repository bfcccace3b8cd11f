"""Structured logs on request: ``METERING_LOG_FORMAT=json``.

One JSON object per line, with ``time`` (UTC, ISO 8601), ``level``,
``logger`` and ``message``; then ``exception`` (the formatted traceback)
when there is one, and every extra field the call passed
(``log.info("...", extra={"batch": 3})``), made JSON-safe with `repr` when
it is not, and cut after `MAX_FIELD_CHARS` characters. The default,
``text``, leaves logging as it is.

`configure_logging` sets up the root logger of a process (the workers call
it from Celery's logging signals, `workers.observability`);
`uvicorn_log_config` is the ``log_config`` to give uvicorn so its own
access and error logs come out the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from metering.errors import ConfigurationError

LOG_FORMATS: Final = ("text", "json")
# An extra field's text past this is cut (the message never is).
MAX_FIELD_CHARS: Final = 2000
# The attributes every LogRecord has: anything else came in ``extra``.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def log_format(env: Mapping[str, str]) -> str:
    """``METERING_LOG_FORMAT``: ``text`` (default) or ``json``."""
    value = (env.get("METERING_LOG_FORMAT") or "text").strip().lower()
    if value not in LOG_FORMATS:
        raise ConfigurationError(f"METERING_LOG_FORMAT must be text or json, got {value!r}")
    return value


def _safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_FIELD_CHARS else value[:MAX_FIELD_CHARS] + "…"
    if isinstance(value, list | tuple):
        return [_safe(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _safe(item) for key, item in value.items()}
    return _safe(repr(value))


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (see the module's documentation)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry and not key.startswith("_"):
                entry[key] = _safe(value)
        return json.dumps(entry, ensure_ascii=False, default=repr)


def use_json(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root logger) the JSON formatter."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())


def configure_logging(fmt: str, level: int | str = logging.INFO) -> None:
    """The root logger writes to stderr in ``fmt`` (``text`` or ``json``) at ``level``."""
    if fmt not in LOG_FORMATS:
        raise ConfigurationError(f"log format must be text or json, got {fmt!r}")
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    root.setLevel(level)
    if fmt == "json":
        use_json(root)


def uvicorn_log_config(fmt: str) -> dict[str, Any] | None:
    """uvicorn's ``log_config`` for ``fmt``: None (uvicorn's own) for ``text``;
    for ``json``, its loggers and the root logger through `JsonFormatter`."""
    if fmt != "json":
        return None
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "metering.logs.JsonFormatter"}},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["default"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["default"], "level": "INFO"},
    }
