"""A seat value's row counts its live events up to two (``live_events`` 2: two or more).

A held value's further events write nothing (a batch of held seats wrote a row per event);
a void of one of two or more counts the value's other live events in the window's results
(`metering.engine.seats.free_seats`). Rows above two are set to two, and
``metering_consume_one`` adds to a value's row only while it is below two. Downgrade
restores the function; rows left at two then stand for two live events.

Revision ID: 0039
Revises: 0038
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

_UP_TO_TWO: tuple[tuple[str, str], ...] = (
    (
        "        DO UPDATE SET live_events = d.live_events + 1;",
        "        DO UPDATE SET live_events = d.live_events + 1 WHERE d.live_events < 2;",
    ),
)


def _consume_one_0038() -> str:
    path = Path(__file__).with_name("0038_draws_on_counters.py")
    spec = importlib.util.spec_from_file_location("draws_on_counters_0038", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.on_counter(module._consume_one_0036()))


def up_to_two(function: str) -> str:
    """``function`` (migration 0038's) adding to a seat value's row only below two."""
    replaced = function
    for old, new in _UP_TO_TWO:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    op.execute("UPDATE distinct_values SET live_events = 2 WHERE live_events > 2")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(up_to_two(_consume_one_0038()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0038())
