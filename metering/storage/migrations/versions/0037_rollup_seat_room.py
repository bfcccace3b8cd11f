"""Room for HOT updates in the rows a batch adds to: rollups and seat values.

A dimension's batch adds to its ``usage_rollups`` rows and a seat batch to the
``distinct_values`` rows of the values it saw again, neither an indexed column
once the rollups' primary key no longer carries ``used`` and ``events``
(``INCLUDE``, migration 0009). On PostgreSQL both tables now keep half their
pages free (fillfactor 50), so such an update skips the key (a HOT update); the
usage report then reads a heap page per rollup row instead of the key alone.
The key is rebuilt once; rows move as they are updated. SQLite: nothing changes.

Revision ID: 0037
Revises: 0036
"""

from __future__ import annotations

from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

TABLES = ("usage_rollups", "distinct_values")
_KEY = "subject, limit_name, dimension, hour_start_us, value"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE usage_rollups DROP CONSTRAINT usage_rollups_pkey, "
            f"ADD CONSTRAINT usage_rollups_pkey PRIMARY KEY ({_KEY})"
        )
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
        op.execute(
            "ALTER TABLE usage_rollups DROP CONSTRAINT usage_rollups_pkey, "
            f"ADD CONSTRAINT usage_rollups_pkey PRIMARY KEY ({_KEY}) INCLUDE (used, events)"
        )
