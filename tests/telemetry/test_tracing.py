"""Tracing (the ``tracing`` extra) with the SDK's in-memory exporter: no collector.

`setup_tracing` is given an ``InMemorySpanExporter`` and no global provider
(``set_global=False``); its `Tracing.shutdown` removes every
instrumentation again, so the rest of the session runs untraced.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from celery import Celery
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pytest_httpserver import HTTPServer

from metering import Limit, Meter
from metering.errors import ConfigurationError
from metering.telemetry.tracing import Tracing, setup_tracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def api() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/things/{thing_id}")
    def thing(thing_id: str) -> dict[str, str]:
        return {"id": thing_id}

    return app


@pytest.fixture
def tracing(exporter: InMemorySpanExporter, api: FastAPI) -> Iterator[Tracing]:
    tracing = setup_tracing("metering-test", app=api, exporter=exporter, set_global=False)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def test_spans_of_sqlalchemy_httpx_celery_and_fastapi(
    tracing: Tracing,
    exporter: InMemorySpanExporter,
    api: FastAPI,
    sqlite_url: str,
    httpserver: HTTPServer,
) -> None:
    # SQLAlchemy: a Meter made after set-up has its statements traced (the
    # hot path's writes go to the driver's cursor, below SQLAlchemy: untraced).
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("traced", maximum=5, period="1d"))
        meter.consume("org-1", "traced")
    statements = [s for s in exporter.get_finished_spans() if s.attributes.get("db.statement")]
    assert statements
    assert all(s.kind == SpanKind.CLIENT for s in statements)
    assert any(
        str(s.attributes["db.statement"]).startswith("INSERT INTO limits") for s in statements
    )

    # httpx (webhook deliveries use it).
    httpserver.expect_request("/hook").respond_with_data("ok")
    with httpx.Client() as client:
        assert client.post(httpserver.url_for("/hook"), content=b"{}").status_code == 200
    posts = [s for s in exporter.get_finished_spans() if s.attributes.get("http.method") == "POST"]
    assert [s.kind for s in posts] == [SpanKind.CLIENT]

    # Celery: publishing a task, and running it.
    app = Celery("traced", broker="memory://")
    app.conf.task_always_eager = False

    @app.task(name="traced.add")
    def add(x: int, y: int) -> int:
        return x + y

    assert add.apply(args=(2, 3)).get() == 5
    add.apply_async(args=(1, 1))
    names = {s.name for s in exporter.get_finished_spans()}
    assert "run/traced.add" in names
    assert "apply_async/traced.add" in names

    # FastAPI: a server span named by the route template.
    async def call() -> int:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return (await client.get("/v1/things/42")).status_code

    assert asyncio.run(call()) == 200
    servers = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == ["GET /v1/things/{thing_id}"]
    resource = servers[0].resource.attributes
    assert resource["service.name"] == "metering-test"


def test_shutdown_removes_the_instrumentation(
    exporter: InMemorySpanExporter, sqlite_url: str
) -> None:
    tracing = setup_tracing("metering-test", exporter=exporter, set_global=False)
    tracing.shutdown()
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("untraced", maximum=5, period="1d"))
    assert exporter.get_finished_spans() == ()


def test_without_the_extra_the_error_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry.sdk'] = None\n"
        "from metering.telemetry.tracing import setup_tracing\n"
        "from metering.errors import ConfigurationError\n"
        "try:\n"
        "    setup_tracing('x')\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = done.stdout.strip()
    assert "\n" not in message
    assert "pip install 'metering[tracing]'" in message
    assert "opentelemetry.sdk" in message


def test_an_unknown_otlp_protocol_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        setup_tracing("x", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, set_global=False)
