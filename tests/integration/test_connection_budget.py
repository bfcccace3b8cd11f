"""Two processes on a server of few connections, sized by the docs' rule.

A PostgreSQL of its own with ``max_connections = 12``; two processes of 16
threads each, each with ``METERING_DB_CONNECTIONS=5``: processes x budget
(10) is at most max_connections less headroom (the test's own connections),
so no call fails with "too many clients", and every call is answered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import PostgresServer, make_base_dir

from metering import Limit, Meter
from metering.storage.connections import upgrade_schema

CHILD = Path(__file__).with_name("budget_process.py")
MAX_CONNECTIONS = 12
BUDGET = 5
PROCESSES = 2
TIMEOUT = 300

pytestmark = pytest.mark.slow


@pytest.fixture
def small_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = make_base_dir(tmp_path_factory.getbasetemp(), prefix="metering-pg-small-")
    server = PostgresServer(base, settings={"max_connections": str(MAX_CONNECTIONS)})
    server.start()
    try:
        server.create_database("small")
        url = server.url("small")
        upgrade_schema(url)
        with Meter(url, connections=3) as meter:
            meter.set_limit(Limit("calls", maximum=1_000_000, period="1d", window="calendar"))
        yield url
    finally:
        server.destroy()


def test_two_processes_within_the_rule_get_no_too_many_clients(small_url: str) -> None:
    env = {**os.environ, "METERING_DB_CONNECTIONS": str(BUDGET)}
    assert PROCESSES * BUDGET <= MAX_CONNECTIONS - 2  # the rule, with headroom
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), small_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            assert child.stdout is not None
            reports.append(json.loads(child.stdout.readline()))
            assert child.wait(TIMEOUT) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(TIMEOUT)
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()
    assert [r["errors"] for r in reports] == [[], []]
    assert [r["answered"] for r in reports] == [16 * 30, 16 * 30]
