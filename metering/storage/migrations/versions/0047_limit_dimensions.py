"""Each limit's dimensions keep a history, so a give-back takes from the rows its event used.

``limit_dimensions``: per limit, its dimensions from a tick of the reset clock on. Each
limit at the upgrade gets a ``seeded`` row with its dimensions at a new tick (the clock
advanced once here, so every result written after has a tick at or above it) and its
``updated_at_us``: a result written before counts under them when decided since then.
Downgrade drops the table.

Revision ID: 0047
Revises: 0046
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limit_dimensions",
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("tick", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("since_us", sa.BigInteger, nullable=False),
        sa.Column("dimensions", sa.Text, nullable=False),
        sa.Column("seeded", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("limit_name", "tick"),
    )
    bind = op.get_bind()
    if not bind.execute(sa.text("SELECT 1 FROM reset_clock WHERE id = 1")).first():
        bind.execute(sa.text("INSERT INTO reset_clock (id, tick) VALUES (1, 0)"))
    bind.execute(sa.text("UPDATE reset_clock SET tick = tick + 1 WHERE id = 1"))
    bind.execute(
        sa.text(
            "INSERT INTO limit_dimensions (limit_name, tick, since_us, dimensions, seeded) "
            "SELECT l.name, c.tick, l.updated_at_us, l.dimensions, :seeded "
            "FROM limits AS l CROSS JOIN reset_clock AS c WHERE c.id = 1"
        ),
        {"seeded": True},
    )


def downgrade() -> None:
    op.drop_table("limit_dimensions")
