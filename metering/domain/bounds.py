"""Bounds on the plain numbers callers pass in: listing sizes, row ids, seconds.

Checked at the public edge, before a value reaches SQL: SQLite cannot bind an
integer beyond 64 bits (`OverflowError`), ``LIMIT -1`` means no limit at all,
and NaN or infinite seconds overflow a `timedelta` or turn into nonsense
instants. Each check raises `InvalidInput` naming the argument.
"""

from __future__ import annotations

import math
from typing import Final

from metering.errors import InvalidInput

MAX_LISTING: Final = 1_000_000
MAX_ROW_ID: Final = 2**63 - 1
# A century of seconds: longer than any retention or grace period worth having.
MAX_DURATION_SECONDS: Final = 100 * 366 * 86_400
SHOWN_CHARS: Final = 60


def shown(value: object) -> str:
    """``repr(value)`` short enough for a one-line error message.

    A huge integer is described, not printed (beyond 4,300 digits Python
    refuses to print it at all); long text is cut with an ellipsis.
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def validate_whole(
    field_name: str,
    value: object,
    low: int,
    high: int,
    *,
    grouped: bool = False,
    error: type[InvalidInput] = InvalidInput,
) -> int:
    """A whole number (never a bool) from ``low`` to ``high``, else ``error``
    naming ``field_name``; ``grouped``: ``high`` shown with thousands separators."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(field_name, f"must be a whole number, got {shown(value)}")
    if not low <= value <= high:
        bound = f"{high:,}" if grouped else f"{high}"
        raise error(field_name, f"must be between {low} and {bound}, got {shown(value)}")
    return value


def validate_count(field_name: str, value: object, maximum: int = MAX_LISTING) -> int:
    """How many rows to list: a whole number from 1 to ``maximum``."""
    return validate_whole(field_name, value, 1, maximum, grouped=True)


def validate_row_id(field_name: str, value: object) -> int:
    """A stored row's integer id: 1 to 2**63 - 1."""
    return validate_whole(field_name, value, 1, MAX_ROW_ID)


def validate_seconds(
    field_name: str, value: object, maximum: float = MAX_DURATION_SECONDS
) -> float:
    """A duration in seconds: finite, from 0 to ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field_name, f"must be a number of seconds, got {shown(value)}")
    finite = not isinstance(value, float) or math.isfinite(value)
    if not finite or not 0 <= value <= maximum:
        raise InvalidInput(
            field_name, f"must be from 0 to {maximum:,.0f} seconds, got {shown(value)}"
        )
    return float(value)
