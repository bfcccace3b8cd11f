"""Polling for the webhook tests (a module of its own: ``from conftest import``
finds whichever conftest was imported first when several directories run)."""

from __future__ import annotations

import time
from collections.abc import Callable

DEADLINE = 30.0


def wait_for(
    condition: Callable[[], bool], what: Callable[[], str], timeout: float = DEADLINE
) -> None:
    """Poll until ``condition()`` holds; fail with ``what()`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s: {what()}")
        time.sleep(0.05)
