"""Keys that lead with the subject; no time-ordered index written on the hot path.

For a PostgreSQL-compatible distributed database (CockroachDB, YugabyteDB),
which splits a table into ranges by primary key: counters, first-use
windows and notification marks are keyed ``(subject, limit, ...)``, so one
subject's rows sit together and different subjects spread over ranges.
Indexes whose leading column is a time (``counters.window_start_us``,
``results.decided_at_us``) received every new row at one end, one hot range;
they are dropped. The subject-first primary key serves what the subject
index served. Reports over all subjects of a period scan the counters.

On PostgreSQL this also removes a planner trap: with statistics behind a
fast-growing table, the window-start index looked cheapest for a counter's
lookup and filtered a whole window's rows (measured: 5 ms for 32 counters).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_KEYS = {
    "counters": (
        ["subject", "limit_name", "window_start_us"],
        ["limit_name", "subject", "window_start_us"],
    ),
    "current_windows": (["subject", "limit_name"], ["limit_name", "subject"]),
    "webhook_marks": (
        ["subject", "limit_name", "window_start_us", "kind"],
        ["limit_name", "subject", "window_start_us", "kind"],
    ),
}


def _counters(key: list[str]) -> sa.Table:
    return sa.Table(
        "counters",
        sa.MetaData(),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("window_end_us", sa.BigInteger, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
        sa.Column("denied_count", sa.BigInteger, nullable=False),
        sa.Column("denied_cost", sa.BigInteger, nullable=False),
        sa.Column("first_denied_at_us", sa.BigInteger, nullable=True),
        sa.Column("tat_us", sa.BigInteger, nullable=True),
        sa.Column("tat_rem", sa.BigInteger, nullable=False),
        sa.Column("tat_scale", sa.BigInteger, nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(*key),
    )


def _current_windows(key: list[str]) -> sa.Table:
    return sa.Table(
        "current_windows",
        sa.MetaData(),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=True),
        sa.Column("window_end_us", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint(*key),
    )


def _webhook_marks(key: list[str]) -> sa.Table:
    table = sa.Table(
        "webhook_marks",
        sa.MetaData(),
        sa.Column("limit_name", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("window_start_us", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("window_end_us", sa.BigInteger, nullable=False),
        sa.Column("maximum", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.String(128), nullable=True),
        sa.Column("created_at_us", sa.BigInteger, nullable=False),
        sa.Column("due_at_us", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint(*key),
    )
    sa.Index("ix_webhook_marks_due_at_us", table.c.due_at_us)
    return table


_TABLES = {
    "counters": _counters,
    "current_windows": _current_windows,
    "webhook_marks": _webhook_marks,
}


def _rekey(new: bool) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name, (subject_first, limit_first) in _KEYS.items():
        key = subject_first if new else limit_first
        if sqlite:  # SQLite cannot change a primary key: the table is rebuilt
            with op.batch_alter_table(name, copy_from=_TABLES[name](key), recreate="always"):
                pass
        else:
            op.execute(
                f"ALTER TABLE {name} DROP CONSTRAINT {name}_pkey, "
                f"ADD CONSTRAINT {name}_pkey PRIMARY KEY ({', '.join(key)})"
            )


def upgrade() -> None:
    op.drop_index("ix_counters_subject", table_name="counters")
    op.drop_index("ix_counters_window_start_us", table_name="counters")
    op.drop_index("ix_results_decided_at_us", table_name="results")
    _rekey(new=True)


def downgrade() -> None:
    _rekey(new=False)
    op.create_index("ix_results_decided_at_us", "results", ["decided_at_us"])
    op.create_index("ix_counters_window_start_us", "counters", ["window_start_us"])
    op.create_index("ix_counters_subject", "counters", ["subject", "limit_name", "window_start_us"])
