"""httpx clients for the tests' servers on loopback, sharing one TLS context.

httpx builds a TLS context for every client it makes (certifi's bundle
loaded again: about 40 ms of CPU), and the API and middleware tests make
hundreds of clients, for plain HTTP on 127.0.0.1. `http_client` gives each
the process's one context, made on first use.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def http_client(**options: Any) -> httpx.Client:
    """`httpx.Client(**options)`, with the process's one TLS context."""
    return httpx.Client(verify=_tls(), **options)
