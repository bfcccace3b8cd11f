"""Clocks: time is passed in, never read all over the code.

A clock is any callable returning an aware UTC datetime. `SystemClock` is
the default; tests use `FrozenClock` and move it by hand.
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
