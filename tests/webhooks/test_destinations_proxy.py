"""Deliveries through an HTTP proxy (``METERING_WEBHOOKS_PROXY``), a real one.

The proxy is proxy.py, started for each test on loopback. Deliveries ask it
for a ``CONNECT`` tunnel to the address they checked, never to a name: the
proxy resolves nothing, so a rebound name cannot take a delivery past the
check through it. The receiver is on 127.0.0.2 (let through as if public),
the "internal" service on 127.0.0.1, as in test_destinations.py.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from rebinding import REBIND_HOST, RebindingResolver, certificate, settings_for
from servers import free_port

from metering import Limit, Meter
from metering.errors import ConfigurationError
from metering.settings import WebhookProxy, parse_proxy
from metering.webhooks import DeliverySettings, Webhooks
from metering.webhooks.delivery import deliver_due
from metering.webhooks.destinations import delivery_client


@dataclass
class Proxy:
    port: int
    log: Path

    def url(self, credentials: str = "") -> str:
        return f"http://{credentials}127.0.0.1:{self.port}"

    def connects(self) -> list[str]:
        """The targets it was asked to ``CONNECT`` to, in its access log."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if " - CONNECT " in line:
                found.append(line.split(" - CONNECT ", 1)[1].split(" ", 1)[0])
        return found


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(auth: str | None = None) -> Proxy:
        port = free_port()
        log = tmp_path / f"proxy-{port}.log"
        command = [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", str(port)]
        command += ["--num-workers", "1", "--num-acceptors", "1", "--log-file", str(log)]
        if auth is not None:
            command += ["--basic-auth", auth]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        started.append(process)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"proxy.py did not start: {log.read_text()}") from None
                time.sleep(0.05)
        return Proxy(port, log)

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def one_attempt(db_url: str, settings: DeliverySettings, url: str, **client: Any) -> Any:
    """One denial's delivery to ``url``, made now: its attempt."""
    with Meter(db_url) as meter:
        meter.set_limit(Limit("send", maximum=1, period="1h"))
        hooks = Webhooks(meter, settings)
        hooks.add(url)
        meter.consume("s-1", "send")
        meter.consume("s-1", "send")
        with delivery_client(settings, **client) as http:
            deliver_due(meter, settings, client=http)
        [attempt] = hooks.attempts(hooks.deliveries()[0].id)
    return attempt


def test_a_delivery_tunnels_to_the_checked_address_with_the_proxys_credentials(
    sqlite_url: str,
    start_proxy: Callable[..., Proxy],
    public: HTTPServer,
    internal: HTTPServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The name resolves to the receiver once (checked), to 127.0.0.1 after:
    the proxy is asked for the checked address, and the receiver gets the POST
    with the name in its Host header."""
    proxy = start_proxy(auth="hook:s3cret")
    resolver = RebindingResolver("127.0.0.2", "127.0.0.1")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    settings = replace(settings_for("127.0.0.2"), proxy=parse_proxy(proxy.url("hook:s3cret@")))
    attempt = one_attempt(sqlite_url, settings, f"http://{REBIND_HOST}:{public.port}/hook")
    assert attempt.status_code == 200, attempt
    assert proxy.connects() == [f"127.0.0.2:{public.port}"]
    assert internal.log == [] and len(public.log) == 1
    request, _ = public.log[0]
    assert request.headers["host"] == f"{REBIND_HOST}:{public.port}"
    assert "proxy-authorization" not in request.headers  # the proxy's, not the receiver's
    assert resolver.asked == 1


def test_tls_through_the_tunnel_verifies_the_name(
    sqlite_url: str,
    start_proxy: Callable[..., Proxy],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca_pem, cert_pem, key_pem = certificate([REBIND_HOST])
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = HTTPServer(host="127.0.0.2", port=0, ssl_context=server_context, threaded=True)
    server.expect_request("/hook").respond_with_data("ok")
    server.start()
    proxy = start_proxy()
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("127.0.0.2", "127.0.0.1"))
    settings = replace(settings_for("127.0.0.2"), proxy=parse_proxy(proxy.url()))
    try:
        verify = ssl.create_default_context(cadata=ca_pem.decode())
        url = f"https://{REBIND_HOST}:{server.port}/hook"
        attempt = one_attempt(sqlite_url, settings, url, verify=verify)
        received = len(server.log)
    finally:
        server.clear()
        server.stop()
    assert attempt.status_code == 200, attempt
    assert proxy.connects() == [f"127.0.0.2:{server.port}"] and received == 1


def test_a_refused_destination_never_reaches_the_proxy(
    sqlite_url: str,
    start_proxy: Callable[..., Proxy],
    public: HTTPServer,
    internal: HTTPServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = start_proxy()
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("127.0.0.1", "127.0.0.2"))
    settings = replace(settings_for("127.0.0.2"), proxy=parse_proxy(proxy.url()))
    attempt = one_attempt(sqlite_url, settings, f"http://{REBIND_HOST}:{public.port}/hook")
    assert attempt.status_code is None and (attempt.error or "").startswith("refused:"), attempt
    assert proxy.connects() == [] and public.log == [] and internal.log == []


def test_a_proxy_that_refuses_the_tunnel_fails_the_attempt_with_its_status(
    sqlite_url: str,
    start_proxy: Callable[..., Proxy],
    public: HTTPServer,
) -> None:
    proxy = start_proxy(auth="hook:s3cret")
    settings = replace(settings_for("127.0.0.2"), proxy=parse_proxy(proxy.url("hook:wrong@")))
    attempt = one_attempt(sqlite_url, settings, f"http://127.0.0.2:{public.port}/hook")
    assert attempt.status_code is None, attempt
    want = f"the proxy 127.0.0.1:{proxy.port} answered 407 to CONNECT 127.0.0.2:{public.port}"
    assert want in (attempt.error or ""), attempt
    assert "wrong" not in (attempt.error or "") and public.log == []


def test_a_proxy_out_of_reach_is_named_in_the_attempt(sqlite_url: str, public: HTTPServer) -> None:
    port = free_port()  # nothing listens there
    settings = replace(settings_for("127.0.0.2"), proxy=parse_proxy(f"http://127.0.0.1:{port}"))
    attempt = one_attempt(sqlite_url, settings, f"http://127.0.0.2:{public.port}/hook")
    assert attempt.status_code is None, attempt
    assert f"the proxy 127.0.0.1:{port}" in (attempt.error or ""), attempt
    assert public.log == []


@pytest.fixture
def hostile_proxy() -> Iterator[Callable[[bytes | None], int]]:
    """A listener that answers every connection with the bytes given (None:
    nothing at all), then holds it open: its port."""
    import threading

    listeners: list[socket.socket] = []

    def start(answer: bytes | None) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            held = []
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    break
                held.append(connection)
                connection.recv(65536)
                if answer is not None:
                    connection.sendall(answer)
            for connection in held:
                connection.close()

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "answered no HTTP status to CONNECT"),
        (b"HTTP/1.1 200 OK\r\n\r\nearly", "answered bytes past its answer to CONNECT"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * 20_000, "answered an answer too long to CONNECT"),
        (None, "timeout after 0.5 s"),
    ],
    ids=["not-http", "bytes-past", "endless", "silent"],
)
def test_a_proxy_that_answers_no_tunnel_fails_the_attempt(
    sqlite_url: str,
    hostile_proxy: Callable[[bytes | None], int],
    public: HTTPServer,
    answer: bytes | None,
    error: str,
) -> None:
    port = hostile_proxy(answer)
    settings = replace(
        settings_for("127.0.0.2"),
        timeout_seconds=0.5,
        proxy=parse_proxy(f"http://127.0.0.1:{port}"),
    )
    attempt = one_attempt(sqlite_url, settings, f"http://127.0.0.2:{public.port}/hook")
    assert attempt.status_code is None and error in (attempt.error or ""), attempt
    assert public.log == []


# -- METERING_WEBHOOKS_PROXY -----------------------------------------------------


def test_the_proxy_comes_from_the_environment_with_its_credentials_hidden() -> None:
    settings = DeliverySettings.from_env(
        {"METERING_WEBHOOKS_PROXY": "http://us%40er:p%3Ass@proxy.internal:3128/"}
    )
    proxy = settings.proxy
    assert proxy == WebhookProxy("proxy.internal", 3128, "Basic dXNAZXI6cDpzcw==")
    assert str(proxy) == "proxy.internal:3128"
    assert "dXNAZXI" not in repr(settings)
    assert parse_proxy("http://proxy.internal") == WebhookProxy("proxy.internal", 80)
    assert parse_proxy("  ") is None and DeliverySettings.from_env({}).proxy is None


@pytest.mark.parametrize(
    "value",
    [
        "https://proxy.internal:3128",
        "socks5://proxy.internal:1080",
        "proxy.internal:3128",
        "http://:3128",
        "http://proxy.internal:3128/path",
        "http://proxy.internal:3128?x=1",
        "http://proxy.internal:99999",
        "http://user:secret@proxy.internal:port",
    ],
)
def test_a_proxy_setting_that_names_no_http_proxy_is_refused_without_its_secret(
    value: str,
) -> None:
    with pytest.raises(ConfigurationError, match="METERING_WEBHOOKS_PROXY") as refused:
        DeliverySettings.from_env({"METERING_WEBHOOKS_PROXY": value})
    assert "secret" not in str(refused.value)
