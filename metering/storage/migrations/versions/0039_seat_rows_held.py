"""A seat value's row keeps 1 while the value has a live event: ``distinct_values.live_events``.

A held value's further events write nothing (a batch of held seats wrote a row per event);
a void counts the value's other live events in the window's results instead
(`metering.engine.seats.free_seats`). Rows above 1 are set to 1, and
``metering_consume_one`` writes a value's row only when it is new or at 0. Downgrade
restores the function; the rows left at 1 then count one live event each.

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

_HELD: tuple[tuple[str, str], ...] = (
    (
        "        DO UPDATE SET live_events = d.live_events + 1;",
        "        DO UPDATE SET live_events = 1 WHERE d.live_events = 0;",
    ),
)


def _consume_one_0038() -> str:
    path = Path(__file__).with_name("0038_draws_on_counters.py")
    spec = importlib.util.spec_from_file_location("draws_on_counters_0038", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.on_counter(module._consume_one_0036()))


def held(function: str) -> str:
    """``function`` (migration 0038's) writing a seat value's row only when new or at 0."""
    replaced = function
    for old, new in _HELD:
        assert replaced.count(old) == 1, old
        replaced = replaced.replace(old, new)
    return replaced


def upgrade() -> None:
    op.execute("UPDATE distinct_values SET live_events = 1 WHERE live_events > 1")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(held(_consume_one_0038()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_consume_one_0038())
