"""Structured logs on request (``METERING_LOG_FORMAT=json``; docs/metrics.md), and no secrets.

JSON: one object per line, with ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, ``exception`` when there is one, and every extra field of the call (`repr` when
not JSON, cut after `MAX_FIELD_CHARS`). ``text``, the default, leaves logging as it is.
`use_json` and `redact_handlers` set up a logger's handlers (the workers call them from
Celery's logging signals, `workers.observability`); `uvicorn_log_config` is uvicorn's
``log_config``. `RedactSecrets`, on every handler these set up, writes each absolute URL
in a message, traceback or JSON extra field as `redact` does: userinfo as ``user:***`` (a
user name alone as ``***``) and each query value as ``***`` (httpx logs URLs at INFO).
"""

from __future__ import annotations

import copy
import json
import logging
import re
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


# An absolute URL (scheme://authority...) up to whitespace or a quote.
_URL: Final = re.compile(r"""\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s"'<>`]+""")
# Its userinfo: everything before the last @ of the authority.
_USERINFO: Final = re.compile(r"^(?P<scheme>[^:]+://)(?P<userinfo>[^/?#]*)@")
# A query or fragment parameter's value.
_QUERY_VALUE: Final = re.compile(r"(?P<key>[?&;][^=&;#?]*=)[^&;#]*")
REDACTED: Final = "***"


def _redact_url(match: re.Match[str]) -> str:
    url = match.group(0)
    userinfo = _USERINFO.match(url)
    if userinfo is not None:
        user, colon, _password = userinfo.group("userinfo").partition(":")
        shown = f"{user}:{REDACTED}" if colon else REDACTED
        url = f"{userinfo.group('scheme')}{shown}@{url[userinfo.end() :]}"
    head, mark, query = url.partition("?")
    if mark:
        url = head + _QUERY_VALUE.sub(rf"\g<key>{REDACTED}", mark + query)
    return url


def redact(text: str) -> str:
    """``text`` with the secrets of every absolute URL in it shown as ``***``:
    the password of its userinfo (a user name alone too) and its query values.

    >>> redact("POST https://hooks:s3cret@example.com/in?token=abc&x=1 done")
    'POST https://hooks:***@example.com/in?token=***&x=*** done'
    """
    if "://" not in text:
        return text
    return _URL.sub(_redact_url, text)


class RedactSecrets(logging.Filter):
    """Rewrites a record's message and traceback with `redact` (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it itself
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def redact_handlers(logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (default: the root logger) `RedactSecrets`, once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())


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
        value = redact(value)
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
        if record.exc_text:  # formatted already (and redacted: `RedactSecrets`)
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
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


def uvicorn_log_config(fmt: str) -> dict[str, Any]:
    """uvicorn's ``log_config`` for ``fmt``: for ``text``, uvicorn's own, with
    the root logger's warnings beside its lines; for ``json``, its loggers and
    the root logger (at INFO) through `JsonFormatter`. Every handler redacts
    URLs' secrets (`RedactSecrets`)."""
    redacting = {"redact": {"()": "metering.telemetry.logs.RedactSecrets"}}
    if fmt != "json":
        from uvicorn.config import LOGGING_CONFIG

        config = copy.deepcopy(LOGGING_CONFIG)
        config["filters"] = {**config.get("filters", {}), **redacting}
        for handler in config["handlers"].values():
            handler["filters"] = [*handler.get("filters", []), "redact"]
        config.setdefault("root", {"handlers": ["default"], "level": "WARNING"})
        return config
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "stream": "ext://sys.stderr",
        "filters": ["redact"],
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": redacting,
        "formatters": {"json": {"()": "metering.telemetry.logs.JsonFormatter"}},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["default"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["default"], "level": "INFO"},
    }
