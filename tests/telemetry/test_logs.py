"""Logs (`metering/telemetry/logs.py`): JSON lines with time, level, logger, message and
extras; uvicorn's logs in the same format; and no URL password or query value
in any line or traceback (`redact`)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from datetime import datetime

import pytest

from metering.telemetry.logs import JsonFormatter, RedactSecrets, redact


def test_json_log_lines_carry_time_level_logger_message_and_extras() -> None:
    formatter = JsonFormatter()
    logger = logging.getLogger("metering.test")
    record = logger.makeRecord(
        "metering.test",
        logging.WARNING,
        __file__,
        1,
        "batch %s applied",
        ("b-1",),
        None,
        extra={"applied": 3, "limits": ("a", "b"), "odd": object(), "text": 'a "quoted"\nline'},
    )
    line = formatter.format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "metering.test"
    assert entry["message"] == "batch b-1 applied"
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None
    assert entry["applied"] == 3
    assert entry["limits"] == ["a", "b"]
    assert entry["odd"].startswith("<object")
    assert entry["text"] == 'a "quoted"\nline'

    try:
        raise ValueError("bad")
    except ValueError:
        record = logger.makeRecord(
            "metering.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    entry = json.loads(formatter.format(record))
    assert "ValueError: bad" in entry["exception"]


def test_uvicorn_log_config_puts_uvicorn_logs_in_json() -> None:
    code = textwrap.dedent(
        """
        import logging, logging.config
        from metering.telemetry.logs import uvicorn_log_config
        logging.config.dictConfig(uvicorn_log_config("json"))
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/v1/x", "1.1", 200
        )
        logging.getLogger("uvicorn.error").info("Started server process")
        logging.getLogger("metering.api").warning("from the app")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["logger"], e["level"]) for e in lines] == [
        ("uvicorn.access", "INFO"),
        ("uvicorn.error", "INFO"),
        ("metering.api", "WARNING"),
    ]
    assert lines[0]["message"] == '127.0.0.1:5000 - "GET /v1/x HTTP/1.1" 200'


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            'HTTP Request: POST https://hooks:s3cret@example.com/in "HTTP/1.1 200 OK"',
            'HTTP Request: POST https://hooks:***@example.com/in "HTTP/1.1 200 OK"',
        ),
        ("to https://tok3n@example.com/x", "to https://***@example.com/x"),
        ("https://u:p@ss@example.com/x", "https://u:***@example.com/x"),
        ("http://h.example/a?token=s3cret&b=2#f", "http://h.example/a?token=***&b=***#f"),
        ("redis://:pw@127.0.0.1:6379/0 down", "redis://:***@127.0.0.1:6379/0 down"),
        ("GET /v1/usage?subject=a 200", "GET /v1/usage?subject=a 200"),
        ("no URL here: a@b", "no URL here: a@b"),
    ],
)
def test_redact_hides_a_urls_password_and_query_values(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redact_secrets_rewrites_the_message_and_the_traceback() -> None:
    logger = logging.getLogger("metering.test")
    try:
        raise ValueError("cannot reach https://u:s3cret@example.com/")
    except ValueError:
        record = logger.makeRecord(
            "httpx",
            logging.INFO,
            __file__,
            1,
            "POST %s",
            ("https://u:s3cret@h/?k=v",),
            sys.exc_info(),
        )
    assert RedactSecrets().filter(record)
    text = logging.Formatter().format(record)
    assert "s3cret" not in text and "k=v" not in text
    assert "POST https://u:***@h/?k=***" in text
    assert "s3cret" not in JsonFormatter().format(record)
    record.url = "https://u:s3cret@h/"  # an extra field
    assert json.loads(JsonFormatter().format(record))["url"] == "https://u:***@h/"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_servers_logs_carry_no_url_password(fmt: str) -> None:
    code = textwrap.dedent(
        f"""
        import logging, logging.config
        from metering.telemetry.logs import uvicorn_log_config
        logging.config.dictConfig(uvicorn_log_config({fmt!r}))
        logging.getLogger("httpx").warning("HTTP Request: POST %s", "https://u:s3cret@h/")
        logging.getLogger("uvicorn.error").info("at https://u:s3cret@h/")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.count("https://u:***@h/") == 2, done.stderr
    assert "s3cret" not in done.stderr
