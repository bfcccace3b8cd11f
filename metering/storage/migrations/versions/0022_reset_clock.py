"""Resets and results ordered by which was written first: a reset clock.

* ``reset_clock``: one row whose ``tick`` every reset advances, under the
  locks of the counters it clears.
* ``results.reset_tick``: the tick when the result was written, after its
  counters were locked; on PostgreSQL the column's default reads the clock,
  so every writer records it.
* ``counter_resets.tick`` and ``window_start_us``: the counter a reset
  cleared, exactly, and its tick. A void skips a charge only when a reset
  of its counter has a greater tick than the event's result.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

TICK_FUNCTION = """
CREATE OR REPLACE FUNCTION metering_reset_tick() RETURNS bigint LANGUAGE sql STABLE AS
$$ SELECT coalesce((SELECT tick FROM reset_clock WHERE id = 1), 0) $$
"""


def upgrade() -> None:
    op.create_table(
        "reset_clock",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("tick", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO reset_clock (id, tick) VALUES (1, 0)")
    op.add_column(
        "results", sa.Column("reset_tick", sa.BigInteger, nullable=False, server_default="0")
    )
    op.add_column("counter_resets", sa.Column("window_start_us", sa.BigInteger, nullable=True))
    op.add_column("counter_resets", sa.Column("tick", sa.BigInteger, nullable=True))
    op.create_index(
        "ix_counter_resets_counter", "counter_resets", ["subject", "limit_name", "tick"]
    )
    if op.get_context().dialect.name == "postgresql":
        op.execute(TICK_FUNCTION)
        op.execute("ALTER TABLE results ALTER COLUMN reset_tick SET DEFAULT metering_reset_tick()")


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("ALTER TABLE results ALTER COLUMN reset_tick SET DEFAULT 0")
        op.execute("DROP FUNCTION metering_reset_tick()")
    op.drop_index("ix_counter_resets_counter", table_name="counter_resets")
    with op.batch_alter_table("counter_resets") as batch:
        batch.drop_column("tick")
        batch.drop_column("window_start_us")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("reset_tick")
    op.drop_table("reset_clock")
