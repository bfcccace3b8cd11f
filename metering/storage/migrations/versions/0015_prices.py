"""Prices and spend limits.

* ``limits.currency``: a spend limit's ISO 4217 code; its maximum and
  counters are integers of the currency's minor unit.
* ``prices``: a limit's price per unit, in micro-minor units, effective-dated
  (rows are history; a NULL price ends pricing from then on).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("limits") as batch:
        batch.add_column(sa.Column("currency", sa.String(3), nullable=True))
    op.create_table(
        "prices",
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("effective_from_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("per_unit", sa.BigInteger, nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("limit_name", "effective_from_us"),
    )


def downgrade() -> None:
    op.drop_table("prices")
    with op.batch_alter_table("limits") as batch:
        batch.drop_column("currency")
