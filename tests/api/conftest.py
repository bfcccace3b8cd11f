"""The HTTP API under a real uvicorn on a loopback port, for real HTTP clients.

`serve_api(app)` runs uvicorn in a thread of the test process (lifespan on,
so the app opens and closes what it owns) on a free port of 127.0.0.1 and
returns the base URL; the test may share its `Meter` (and frozen clock)
with the app. `serve_api_shared` is the same for tests that need a real
socket but not a server of their own: one uvicorn a module, the test's app
mounted on it (its lifespan run) for the test. The default app here runs
on SQLite and the embedded broker in the test's directory, as ``metering
serve`` does with no configuration.
`api_worker` is a real ``celery -A workers worker`` process on the test's
PostgreSQL and Redis, for the tests where queued events must be applied.
`openapi_once`: the API's OpenAPI document is built once a process for
the same routes (about 0.6 s of CPU a build), each app given its own copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from celery_worker import WORKER

Serve = Callable[[Any], str]
InProcess = Callable[[Any], httpx.Client]


def _routes_key(routes: list[Any]) -> tuple[Any, ...] | None:
    """What `get_openapi` reads of ``routes``, when every route in the document
    is a module's router (`create_api`'s): each router and its routes by
    identity (a route added to it changes the key). None: an app with
    a route of its own in the schema, whose document is built every time."""
    key: list[Any] = []
    for route in routes:
        router = getattr(route, "original_router", None)
        if router is not None:
            context = route.include_context
            key.append((id(router), tuple(map(id, router.routes)), context.prefix))
        elif getattr(route, "include_in_schema", False):
            return None
        else:
            key.append((type(route).__name__, getattr(route, "path", None)))
    return tuple(key)


@pytest.fixture(scope="session", autouse=True)
def openapi_once() -> Iterator[None]:
    """`create_api`'s OpenAPI document built once a process for the same title,
    version, description and routes, each app given a deep copy of it (the
    app then adds its schemas to that copy, as to a document built for it)."""
    import metering.api.app as api_app

    build = api_app.get_openapi
    built: dict[tuple[Any, ...], dict[str, Any]] = {}

    def once(*, title: str, version: str, routes: list[Any], **rest: Any) -> dict[str, Any]:
        routes_key = _routes_key(routes)
        if routes_key is None:
            return build(title=title, version=version, routes=routes, **rest)
        key = (title, version, tuple(sorted(rest.items())), routes_key)
        if key not in built:
            built[key] = build(title=title, version=version, routes=routes, **rest)
        return copy.deepcopy(built[key])

    api_app.get_openapi = once
    try:
        yield
    finally:
        api_app.get_openapi = build


def wait_started(server: uvicorn.Server, thread: threading.Thread, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise AssertionError("uvicorn stopped before it started (see the log above)")
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)


@contextlib.contextmanager
def _serving() -> Iterator[Serve]:
    running: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def serve(app: Any) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        running.append((server, thread, sock))
        wait_started(server, thread)
        return f"http://127.0.0.1:{port}"

    try:
        yield serve
    finally:
        # All told to stop before any is waited for: together, not in turn.
        for server, _thread, _sock in running:
            server.should_exit = True
        for _server, thread, sock in running:
            thread.join(15)
            sock.close()


@pytest.fixture
def serve_api() -> Iterator[Serve]:
    """``serve_api(app)`` → the base URL of uvicorn serving ``app``; stopped after the test."""
    with _serving() as serve:
        yield serve


@pytest.fixture(scope="module")
def serve_api_module() -> Iterator[Serve]:
    """`serve_api` for a server that all the tests of a module share."""
    with _serving() as serve:
        yield serve


class _Mounted:
    """An ASGI app that hands each request to the app mounted now (`serve_api_shared`)."""

    def __init__(self) -> None:
        self.app: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            self.loop = asyncio.get_running_loop()
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.app is None:
            raise RuntimeError("no app is mounted: a request after its test ended")
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def _shared_uvicorn() -> Iterator[tuple[str, _Mounted]]:
    mounted = _Mounted()
    with _serving() as serve:
        yield serve(mounted), mounted


@pytest.fixture
def serve_api_shared(_shared_uvicorn: tuple[str, _Mounted]) -> Iterator[Serve]:
    """`serve_api` on the module's one uvicorn: ``serve(app)`` runs ``app``'s
    lifespan on the server's event loop and mounts it until the test ends
    (one app at a time)."""
    url, mounted = _shared_uvicorn
    loop = mounted.loop
    assert loop is not None
    lifespans: list[Any] = []

    def call(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=60)

    def serve(app: Any) -> str:
        assert mounted.app is None, "serve_api_shared serves one app at a time"
        lifespan = app.router.lifespan_context(app)
        call(lifespan.__aenter__())
        lifespans.append(lifespan)
        mounted.app = app
        return url

    try:
        yield serve
    finally:
        mounted.app = None
        for lifespan in lifespans:
            call(lifespan.__aexit__(None, None, None))


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


class _InProcess(httpx.BaseTransport):
    """A sync httpx transport to an ASGI app in this process: httpx's ASGITransport
    on an event loop of its own thread, inside the app's lifespan (no socket)."""

    def __init__(self, app: Any) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._lifespan = app.router.lifespan_context(app)
        self._call(self._lifespan.__aenter__())

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(request.stream, httpx.AsyncByteStream):
            request.stream = _Chunks(request.stream)  # a generator body: sent chunk by chunk

        async def send() -> httpx.Response:
            answer = await self._asgi.handle_async_request(request)
            body = await answer.aread()
            return httpx.Response(answer.status_code, headers=answer.headers, content=body)

        response: httpx.Response = self._call(send())
        return response

    def close(self) -> None:
        try:
            self._call(self._lifespan.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
            self._loop.close()


@contextlib.contextmanager
def _in_process() -> Iterator[InProcess]:
    clients: list[httpx.Client] = []

    def client(app: Any) -> httpx.Client:
        made = httpx.Client(transport=_InProcess(app), base_url="http://testserver", timeout=30)
        clients.append(made)
        return made

    try:
        yield client
    finally:
        for made in clients:
            made.close()


@pytest.fixture
def in_process() -> Iterator[InProcess]:
    """``in_process(app)`` → an httpx.Client that calls ``app`` in this process
    (httpx's ASGITransport, the lifespan run): for tests that need no real server."""
    with _in_process() as client:
        yield client


@pytest.fixture(scope="module")
def in_process_module() -> Iterator[InProcess]:
    """`in_process` for an app that all the tests of a module share."""
    with _in_process() as client:
        yield client


@pytest.fixture
def http(meter: Any, in_process: InProcess, tmp_path: Path) -> httpx.Client:
    """The API of the module's ``meter`` fixture, called in process (its broker
    a file in the test's directory). A module with no ``meter`` defines its own."""
    from metering.api import create_api
    from metering.settings import Settings

    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    return in_process(create_api(settings, meter=meter))


@pytest.fixture
def embedded(tmp_path: Path) -> dict[str, str]:
    """URLs of the embedded default in the test's directory: SQLite and the SQLite broker."""
    return {
        "database_url": f"sqlite:///{tmp_path}/metering.db",
        "broker_url": f"sqla+sqlite:///{tmp_path}/metering-broker.db",
    }


READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0


@pytest.fixture
def api_worker(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """A ready ``celery -A workers worker`` on this test's PostgreSQL and Redis,
    in its own process group (its pool included), stopped after the test."""
    log_file = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    env.update(
        METERING_DATABASE_URL=pg_url,
        METERING_BROKER_URL=redis_url,
        METERING_QUEUES="1",
        METERING_VISIBILITY_TIMEOUT="5",
        PYTHONUNBUFFERED="1",
    )
    command = [*WORKER, "--loglevel", "INFO"]
    command += ["--concurrency", "2", "--without-heartbeat", "--without-gossip"]
    command += ["--without-mingle", "-Q", "metering", "-n", "api@%h"]
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while "ready." not in log_file.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the worker did not start:\n{log_file.read_text()}")
            time.sleep(0.1)
        yield process
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown, then SIGKILL whatever is left of the group (pool children)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(STOP_TIMEOUT_SECONDS)
