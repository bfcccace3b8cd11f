"""The embedded broker's switch: ``sqla+`` URLs go to the embedded transport,
and an embedded broker's URL is told from Redis's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from metering.pipeline.transport import EMBEDDED_TRANSPORT, is_embedded_broker


@pytest.mark.parametrize(
    ("url", "embedded"),
    [
        ("sqla+sqlite:////var/lib/metering/broker.db", True),
        ("sqlalchemy+sqlite:///broker.db", True),
        ("redis://localhost:6379/0", False),
        ("rediss://cache:6380/1", False),
        ("sqla+postgresql://db/metering", False),
    ],
)
def test_an_embedded_broker_is_a_sqlite_file(url: str, embedded: bool) -> None:
    assert is_embedded_broker(url) is embedded


def test_sqla_urls_resolve_to_the_embedded_transport_after_the_switch() -> None:
    # In a process of its own: the switch changes kombu's aliases for the process.
    code = (
        "import kombu.transport\n"
        "before = kombu.transport.resolve_transport('sqla')\n"
        "from metering.pipeline.transport import use_embedded_transport\n"
        "use_embedded_transport()\n"
        "after = kombu.transport.resolve_transport('sqla')\n"
        "print(before.__module__ + ':' + before.__name__)\n"
        "print(after.__module__ + ':' + after.__name__)\n"
        "print(kombu.transport.resolve_transport('sqlalchemy') is after)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after, same = done.stdout.split()
    assert before == "kombu.transport.sqlalchemy:Transport"
    assert after == EMBEDDED_TRANSPORT
    assert same == "True"
