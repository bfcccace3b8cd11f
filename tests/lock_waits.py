"""Waiting, in a test, until one PostgreSQL transaction is blocked behind
another's lock: the statistics are polled, never a fixed sleep."""

from __future__ import annotations

import time

from sqlalchemy import Connection, text

WAIT_SECONDS = 10.0


def wait_until_blocked(connection: Connection, blocker_pid: int, waiter: str) -> None:
    """Until some backend waits for a lock ``blocker_pid`` holds; fails
    naming ``waiter`` after `WAIT_SECONDS`."""
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    deadline = time.monotonic() + WAIT_SECONDS
    while not connection.execute(query, {"pid": blocker_pid}).scalar_one():
        connection.rollback()  # the statistics are a snapshot per transaction
        assert time.monotonic() < deadline, f"{waiter} never waited for the open update"
        time.sleep(0.002)


def wait_until_waiting(connection: Connection, waiters: int, what: str) -> None:
    """Until ``waiters`` backends wait for a lock, whoever holds it; fails
    naming ``what`` after `WAIT_SECONDS`."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0"
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while connection.execute(query).scalar_one() < waiters:
        connection.rollback()  # the statistics are a snapshot per transaction
        assert time.monotonic() < deadline, f"{what} never waited"
        time.sleep(0.002)
