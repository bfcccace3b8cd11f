"""The runaway breaker.

* ``limits.breaker``, ``limits.breaker_floor``, ``limits.quarantine_max``: a
  limit's breaker factor (``10x``), the floor of its baseline (units per
  second) and the quarantine maximum; NULL: no breaker.
* ``breakers``: per subject and limit with a breaker, its now and baseline
  rates, the start of its history and its quarantine (`metering.domain.breaker`).

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("limits", sa.Column("breaker", sa.String(8), nullable=True))
    op.add_column("limits", sa.Column("breaker_floor", sa.Double, nullable=True))
    op.add_column("limits", sa.Column("quarantine_max", sa.BigInteger, nullable=True))
    op.create_table(
        "breakers",
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("short_rate", sa.Double, nullable=False),
        sa.Column("long_rate", sa.Double, nullable=False),
        sa.Column("rate_at_us", sa.BigInteger, nullable=False),
        sa.Column("since_us", sa.BigInteger, nullable=False),
        sa.Column("over_since_us", sa.BigInteger, nullable=True),
        sa.Column("quarantined_at_us", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("subject", "limit_name"),
    )


def downgrade() -> None:
    op.drop_table("breakers")
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("quarantine_max")
        batch.drop_column("breaker_floor")
        batch.drop_column("breaker")
