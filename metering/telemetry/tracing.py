"""Optional OpenTelemetry tracing, behind the ``tracing`` extra (docs/metrics.md).

``METERING_TRACING=otlp`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set) turns it on in the workers
and ``metering serve``: `setup_tracing` installs a tracer provider exporting over OTLP
(``http/protobuf``, or ``grpc`` as the ``OTEL_*`` protocol variables say; the rest from the
standard ``OTEL_*`` variables) and the instrumentations of Celery, SQLAlchemy, httpx and,
given the app, FastAPI. Without the extra it raises a one-line `ConfigurationError` naming
it; ``METERING_TRACING=off`` (or unset, without an endpoint) never imports OpenTelemetry.
SQLAlchemy is traced by wrapping ``sqlalchemy.create_engine``, so only engines made after
`setup_tracing` are: call it when the process starts, before a `Meter` exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from metering.errors import ConfigurationError

TRACING_VALUES: Final = ("otlp", "off")
MISSING_EXTRA: Final = (
    "tracing needs the tracing extra: pip install 'metering[tracing]' ({module} is missing)"
)
# Scrapes would be most of the spans of an idle API.
EXCLUDED_URLS: Final = "/metrics,/health"


def tracing_enabled(env: Mapping[str, str]) -> bool:
    """``METERING_TRACING``: ``otlp`` or ``off``; unset, on when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces variant) is set."""
    value = (env.get("METERING_TRACING") or "").strip().lower()
    if not value:
        return bool(
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
    if value not in TRACING_VALUES:
        raise ConfigurationError(f"METERING_TRACING must be otlp or off, got {value!r}")
    return value == "otlp"


@dataclass
class Tracing:
    """A tracer provider and what `setup_tracing` instrumented; `shutdown` undoes it."""

    provider: Any
    instrumentors: list[Any] = field(default_factory=list)
    apps: list[Any] = field(default_factory=list)

    def instrument_app(self, app: Any) -> None:
        """Trace a FastAPI application (before it starts)."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(
            app, tracer_provider=self.provider, excluded_urls=EXCLUDED_URLS
        )
        self.apps.append(app)

    def shutdown(self) -> None:
        """Flush the spans, and remove every instrumentation this made."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        for app in self.apps:
            FastAPIInstrumentor.uninstrument_app(app)
        for instrumentor in self.instrumentors:
            instrumentor.uninstrument()
        self.apps.clear()
        self.instrumentors.clear()
        self.provider.shutdown()


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        import opentelemetry.exporter.otlp.proto.grpc.trace_exporter

        return opentelemetry.exporter.otlp.proto.grpc.trace_exporter.OTLPSpanExporter()
    if protocol != "http/protobuf":
        raise ConfigurationError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or grpc for metering, "
            f"got {protocol!r}"
        )
    import opentelemetry.exporter.otlp.proto.http.trace_exporter

    return opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter()


def setup_tracing(
    service_name: str,
    *,
    app: Any = None,
    exporter: Any = None,
    env: Mapping[str, str] | None = None,
    set_global: bool = True,
) -> Tracing:
    """Trace this process as ``service_name`` (``OTEL_SERVICE_NAME`` wins).

    Spans go to ``exporter`` one by one when given (tests give the SDK's
    ``InMemorySpanExporter``), else in batches over OTLP. ``set_global``
    makes the provider OpenTelemetry's global one. ``env``: the ``OTEL_*``
    variables (`metering.settings.Settings.otel`); none when not given.
    """
    env = {} if env is None else env
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if app is not None:
            import opentelemetry.instrumentation.fastapi  # noqa: F401
        processor = (
            BatchSpanProcessor(_otlp_exporter(env))
            if exporter is None
            else SimpleSpanProcessor(exporter)
        )
    except ImportError as exc:
        raise ConfigurationError(MISSING_EXTRA.format(module=exc.name or exc)) from None

    attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    tracing = Tracing(provider)
    celery = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    for instrumentor in (celery, SQLAlchemyInstrumentor(), HTTPXClientInstrumentor()):
        if not instrumentor.is_instrumented_by_opentelemetry:
            # The SQLAlchemy instrumentation declares "< 2.1" and would do
            # nothing on SQLAlchemy 2.1, whose engine events it uses are
            # unchanged (tests/telemetry/test_tracing.py shows its spans).
            instrumentor.instrument(tracer_provider=provider, skip_dep_check=True)
            tracing.instrumentors.append(instrumentor)
    if app is not None:
        tracing.instrument_app(app)
    return tracing
