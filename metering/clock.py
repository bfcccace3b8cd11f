"""Clocks: time is passed in, never read all over the code.

A clock is any callable returning an aware UTC datetime. `SystemClock` is
the default; tests use `FrozenClock` and move it by hand. `backoff_seconds`
is how long a retry waits after failures in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


class FrozenClock:
    """A clock that stands still until told to move."""

    def __init__(self, now: datetime) -> None:
        if now.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        self.now += delta if delta is not None else timedelta(**kwargs)
        return self.now

    def set(self, now: datetime) -> None:
        self.now = now


def backoff_seconds(failures: int, first_seconds: float, max_seconds: float) -> float:
    """The wait before the next try after ``failures`` failures in a row:
    ``first_seconds``, doubled each failure, at most ``max_seconds``.

    >>> [backoff_seconds(n, 0.25, 30) for n in (1, 2, 3, 9, 10)]
    [0.25, 0.5, 1.0, 30, 30]
    """
    if failures <= 1:
        return first_seconds
    return min(max_seconds, first_seconds * (1 << min(failures - 1, 64)))
