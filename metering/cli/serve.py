"""``metering serve``: the HTTP API under uvicorn."""

from __future__ import annotations

import errno
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import click

from metering.api.app import unsent_at_shutdown
from metering.cli.context import AppState, CliError
from metering.meter import Meter
from metering.settings import Settings, export_to_children
from metering.telemetry.logs import uvicorn_log_config
from metering.telemetry.metrics import enable_multiprocess, metrics_directory

MAX_WORKERS = 256


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    default=1,
    show_default=True,
    help="Server processes, each with its own producer and connections.",
)
@click.option("--broker", envvar="METERING_BROKER_URL", help="Default: the embedded broker.")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@click.option(
    "--access-log/--no-access-log", default=True, show_default=True, help="A log line per request."
)
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    workers: int,
    broker: str | None,
    log_level: str,
    access_log: bool,
) -> None:
    """Serve the HTTP API: usage events in, decisions and usage out.

    Events are queued for `metering worker`. SIGINT and SIGTERM stop it
    alike: exit status 0 after a clean drain; events kept while the broker
    is down and still not sent are named in one line, and the exit status
    is 1 (with --workers 1). The OpenAPI schema is at /openapi.json and its
    documentation at /docs. Every METERING_* variable
    applies (METERING_API_MAX_BODY_BYTES, METERING_API_MAX_EVENTS ...).
    """
    import uvicorn

    state = ctx.find_object(AppState)
    # The server's processes read their settings from the environment.
    if state is not None:
        export_to_children(METERING_DATABASE_URL=state.url)
    if broker:
        export_to_children(METERING_BROKER_URL=broker)
    settings = Settings.from_env()  # a bad variable stops here, as one error line
    check_port_free(host, port)
    # Create or check the schema once, before the processes start together.
    Meter(settings.database_url).close()
    # Several processes count in files of their own, summed by /metrics.
    directory = enable_multiprocess(metrics_directory("api")) if workers > 1 else None
    # uvicorn's own logging, or every line as JSON (METERING_LOG_FORMAT=json);
    # either way without URLs' passwords.
    log_config = uvicorn_log_config(settings.log_format)
    try:
        with sigterm_as_sigint():
            uvicorn.run(
                "metering.api.app:create_api",
                factory=True,
                host=host,
                port=port,
                workers=workers,
                log_level=log_level,
                access_log=access_log,
                log_config=log_config,
            )
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    # Events kept while the broker was down and never sent: the API logged
    # their ids in one line; the exit status says it too.
    if unsent_at_shutdown():
        ctx.exit(1)


def check_port_free(host: str, port: int) -> None:
    """One error line, before uvicorn logs its own and exits 3, when the
    address cannot be listened on (a port in use, an address not here)."""
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise CliError(f"cannot listen on {host}:{port}: {reason or exc}") from None


@contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """SIGTERM (how Docker and systemd stop a service) stops the server as
    SIGINT does: uvicorn drains, then raises the signal it caught again with
    the handler found here, and it ends a SIGINT's `KeyboardInterrupt`
    itself, so the exit status is the one decided after the drain."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
