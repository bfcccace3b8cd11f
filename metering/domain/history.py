"""A subject's usage history as a time series: buckets, sums, the maximum in force.

Pure: `metering.usage.history` reads the figures and hands them here. Buckets are UTC hours or
days (`BUCKETS`), ``[start, start + size)``; a series covers every bucket that meets
``[from, to)``, empty ones included, oldest first, at most `MAX_BUCKETS`. Usage comes as
``(at_us, used)`` pairs and counts in the bucket holding ``at_us`` (a rollup hour, or a
counter window's start). A bucket's maximum is the subject's entitlement in force at its
last instant, else (or a change to None) the limit's default in force then
(`metering.domain.definitions`), as reports take them at a window's end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from metering.domain import definitions, grants
from metering.domain.definitions import Definition
from metering.errors import InvalidInput

Bucket = Literal["hour", "day"]
HOUR_US: Final = 3_600_000_000
BUCKETS: Final[dict[str, int]] = {"hour": HOUR_US, "day": 24 * HOUR_US}
MAX_BUCKETS: Final = 2_000


@dataclass(frozen=True, slots=True)
class Point:
    """One bucket of a series: ``[start_us, end_us)``, what was used in it, and
    the maximum in force at its end (None: the limit has none, a token bucket)."""

    start_us: int
    end_us: int
    used: int
    maximum: int | None


def validate_bucket(bucket: object) -> Bucket:
    if bucket not in BUCKETS:
        raise InvalidInput("bucket", f"must be one of {', '.join(BUCKETS)}; got {bucket!r}")
    return bucket  # type: ignore[return-value]


def bucket_start(at_us: int, bucket: Bucket) -> int:
    """The start of the UTC hour or day holding ``at_us``."""
    size = BUCKETS[bucket]
    return at_us - at_us % size


def bucket_starts(from_us: int, to_us: int, bucket: Bucket) -> list[int]:
    """The starts of the buckets meeting ``[from_us, to_us)``; `InvalidInput`
    if ``to`` is not after ``from`` or there would be more than `MAX_BUCKETS`."""
    if to_us <= from_us:
        raise InvalidInput("to", "must be after from")
    size = BUCKETS[bucket]
    first = bucket_start(from_us, bucket)
    count = (to_us - first + size - 1) // size
    if count > MAX_BUCKETS:
        raise InvalidInput(
            "from", f"the period holds {count} {bucket}s; at most {MAX_BUCKETS} at once"
        )
    return [first + i * size for i in range(count)]


def maximum_at(
    changes: Sequence[tuple[int, int | None]], default: int | None, at_us: int
) -> int | None:
    """The maximum in force at ``at_us``: of ``changes`` (effective from, maximum;
    any order, a later one of the same instant winning), the latest starting at
    or before it; None there means ``default``. The rule is the engines'
    (`metering.domain.grants.maximum_at`), on the changes put in time order."""
    return grants.maximum_at(tuple(sorted(changes, key=_start)), default, at_us)


def _start(change: tuple[int, int | None]) -> int:
    return change[0]


def series(
    usage: Iterable[tuple[int, int]],
    changes: Sequence[tuple[int, int | None]],
    default: int | None,
    from_us: int,
    to_us: int,
    bucket: Bucket,
    aggregation: str = "sum",
    defaults: Sequence[Definition] = (),
) -> list[Point]:
    """Every bucket meeting ``[from_us, to_us)`` with its usage and maximum.

    ``usage``: ``(at_us, used)``, oldest first; pairs outside the buckets are
    left out. A bucket sums its pairs, or, for a gauge's windows (levels),
    takes their peak (``max``) or the last one (``latest``). ``defaults``: the
    limit's definitions, oldest first (none: ``default`` throughout).
    """
    starts = bucket_starts(from_us, to_us, bucket)
    size = BUCKETS[bucket]
    sums = dict.fromkeys(starts, 0)
    for at_us, used in usage:
        start = bucket_start(at_us, bucket)
        if start not in sums:
            continue
        if aggregation == "sum":
            sums[start] += used
        else:
            sums[start] = max(sums[start], used) if aggregation == "max" else used
    return [
        Point(
            start, start + size, sums[start], applied(changes, defaults, default, start + size - 1)
        )
        for start in starts
    ]


def applied(
    changes: Sequence[tuple[int, int | None]],
    defaults: Sequence[Definition],
    default: int | None,
    at_us: int,
) -> int | None:
    """The maximum in force at ``at_us``: the entitlement's (`maximum_at`),
    else the limit's default in force then (``default`` where ``defaults``
    has none, or where it is None: no maximum)."""
    return maximum_at(changes, definitions.default_at(defaults, default, at_us), at_us)
