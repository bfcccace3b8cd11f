"""The audit's own tables (`metering.upkeep.audit`).

* ``audit_marks``: instants by name (the last run's watermark, retention's
  cut-off of results).
* ``audit_windows``: per window, what the ledger says it holds up to the
  watermark, so that a run reads only what came since.
* ``audit_runs``: the latest runs and what they found.
* ``ix_reservations_settled_at_us``: the reservations settled since the
  last run (their give-backs), found by an index, not a scan.
* ``ix_results_decided_at_us``: the results decided since the last run; on
  PostgreSQL a BRIN index (results arrive in about the order of their
  decision, so a run reads the last pages, and an insert costs next to
  nothing), on SQLite a B-tree.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_marks",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "audit_windows",
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, autoincrement=False, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
        sa.Column("maximum", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("subject", "limit_name", "window_start_us"),
    )
    op.create_table(
        "audit_runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
        sa.Column("ran_at_us", sa.BigInteger, nullable=False),
        sa.Column("checked_from_us", sa.BigInteger, nullable=True),
        sa.Column("checked_to_us", sa.BigInteger, nullable=False),
        sa.Column("full", sa.Boolean, nullable=False),
        sa.Column("windows", sa.BigInteger, nullable=False),
        sa.Column("violations", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_reservations_settled_at_us", "reservations", ["settled_at_us"])
    op.create_index(
        "ix_results_decided_at_us", "results", ["decided_at_us"], postgresql_using="brin"
    )


def downgrade() -> None:
    op.drop_index("ix_results_decided_at_us", table_name="results")
    op.drop_index("ix_reservations_settled_at_us", table_name="reservations")
    op.drop_table("audit_runs")
    op.drop_table("audit_windows")
    op.drop_table("audit_marks")
