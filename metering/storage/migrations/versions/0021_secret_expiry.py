"""A product secret can be retired: ``secrets.expires_at_us``.

A rotated secret is kept under another name until this instant (the grace of
old links); NULL: in use, without end.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("secrets") as batch:
        batch.add_column(sa.Column("expires_at_us", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("secrets") as batch:
        batch.drop_column("expires_at_us")
