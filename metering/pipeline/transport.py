"""The embedded broker's switch: `use_embedded_transport` points kombu's ``sqla+``
URLs at `EMBEDDED_TRANSPORT` (`metering.storage.broker.EmbeddedTransport`, named by
its path, so importing this loads neither kombu nor a database); `is_embedded_broker`
tells such a URL from Redis's."""

from __future__ import annotations

from typing import Final

# kombu's SQLAlchemy transport, made safe for processes that start together.
EMBEDDED_TRANSPORT: Final = "metering.storage.broker:EmbeddedTransport"


def use_embedded_transport() -> None:
    """Make ``sqla+`` broker URLs use `EMBEDDED_TRANSPORT` in this process.

    kombu takes the transport from a URL's prefix before any setting, so the
    prefix itself is pointed at ours. kombu also keeps the class it resolved
    for a prefix for the rest of the process: a ``sqla+`` connection made
    before this call (kombu's own, by another library) would otherwise keep
    every later one on kombu's channel, which two processes starting on a new
    broker file break.
    """
    import kombu.transport

    for prefix in ("sqla", "sqlalchemy"):
        kombu.transport.TRANSPORT_ALIASES[prefix] = EMBEDDED_TRANSPORT
        kombu.transport._transport_cache.pop(prefix, None)


def is_embedded_broker(url: str) -> bool:
    return url.startswith(("sqla+sqlite:", "sqlalchemy+sqlite:"))
