"""Tiered prices and flat fees (`metering.domain.money.Price`).

``prices`` gains the price's ``model`` (``per_unit`` for every price before),
its ``tiers`` (JSON: ``[[up_to or null, micro-minor units], ...]``), a
package's size and price, and the ``flat_fee`` charged once a window (minor
units, 0: none).

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("prices") as batch:
        batch.add_column(
            sa.Column("model", sa.String(16), nullable=False, server_default="per_unit")
        )
        batch.add_column(sa.Column("tiers", sa.Text, nullable=True))
        batch.add_column(sa.Column("package_size", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("per_package", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("flat_fee", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("prices") as batch:
        batch.drop_column("flat_fee")
        batch.drop_column("per_package")
        batch.drop_column("package_size")
        batch.drop_column("tiers")
        batch.drop_column("model")
