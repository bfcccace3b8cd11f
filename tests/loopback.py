"""httpx clients for the tests' servers on loopback, sharing one TLS context.

`wait_until_serving` polls a started `metering serve` until it answers.

httpx builds a TLS context for every client it makes (certifi's bundle
loaded again: about 40 ms of CPU), and the API and middleware tests make
hundreds of clients, for plain HTTP on 127.0.0.1. `http_client` gives each
the process's one context, made on first use.
"""

from __future__ import annotations

import functools
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def http_client(**options: Any) -> httpx.Client:
    """`httpx.Client(**options)`, with the process's one TLS context."""
    return httpx.Client(verify=_tls(), **options)


def wait_until_serving(
    process: subprocess.Popen[bytes], base: str, log_path: Path, timeout_seconds: float
) -> None:
    """Poll ``base``'s OpenAPI document with one client until it answers;
    fail with the server's log if it exits or takes ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    with http_client() as client:
        while True:
            try:
                client.get(f"{base}/openapi.json")
                return
            except httpx.TransportError:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "metering serve did not start"
                time.sleep(0.1)
