"""Every pair of operations on one event gives usage back at most once.

* ``reservations.given_back``: the counters a cancel gave a reservation's
  cost back to, so that a later void reverses only what is still charged.
* ``counter_resets``: operators' resets, so that a void of an event decided
  before a reset of its window leaves the counter that started over alone.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("given_back", sa.Text, nullable=True))
    op.create_table(
        "counter_resets",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
        sa.Column("subject", sa.String(200), nullable=True),
        sa.Column("limit_name", sa.String(64), nullable=True),
        sa.Column("reset_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_counter_resets_reset_at_us", "counter_resets", ["reset_at_us"])


def downgrade() -> None:
    op.drop_index("ix_counter_resets_reset_at_us", table_name="counter_resets")
    op.drop_table("counter_resets")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("given_back")
