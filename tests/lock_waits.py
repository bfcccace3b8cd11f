"""Waiting, in a test, until one PostgreSQL transaction is blocked behind
another's lock, or until some wait for any lock: the statistics are
polled, never a fixed sleep."""

from __future__ import annotations

import threading
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


def wait_until_waiting(
    connection: Connection, count: int, waiters: str, thread: threading.Thread | None = None
) -> None:
    """Until ``count`` backends of this database wait for some lock, or
    ``thread`` ended; fails naming ``waiters`` after `WAIT_SECONDS`."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while connection.execute(query).scalar_one() < count:
        if thread is not None and not thread.is_alive():
            return
        connection.rollback()
        assert time.monotonic() < deadline, f"{waiters} never waited for a lock"
        time.sleep(0.002)
