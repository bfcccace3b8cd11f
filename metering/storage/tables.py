"""The schema, as SQLAlchemy Core tables.

Instants are BIGINT microseconds since the Unix epoch in every dialect: exact,
cheap to compare, and the same arithmetic on PostgreSQL and SQLite.
Alembic migrations in ``migrations/`` must produce exactly this schema (a test
compares them).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, MetaData, String, Table, Text

metadata = MetaData()

limits = Table(
    "limits",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("maximum", BigInteger, nullable=False),
    Column("period", String(16), nullable=False),
    Column("algorithm", String(16), nullable=False),
    Column("window", String(16), nullable=False),
    Column("enforcement", String(8), nullable=False),
    Column("thresholds", Text, nullable=False),  # JSON list of percentages
    Column("lateness", String(16), nullable=False),
    Column("updated_at_us", BigInteger, nullable=False),
)

# One row per subject, limit and window; rows of past windows stay for reports.
# A token bucket has a single row with window_start_us = window_end_us = 0.
counters = Table(
    "counters",
    metadata,
    Column("limit_name", String(64), primary_key=True),
    Column("subject", String(200), primary_key=True),
    Column("window_start_us", BigInteger, primary_key=True, autoincrement=False),
    Column("window_end_us", BigInteger, nullable=False),
    Column("used", BigInteger, nullable=False),
    Column("denied_count", BigInteger, nullable=False),
    Column("denied_cost", BigInteger, nullable=False),
    Column("first_denied_at_us", BigInteger, nullable=True),
    Column("tat_us", BigInteger, nullable=True),
    Column("tat_rem", BigInteger, nullable=False),
    Column("tat_scale", BigInteger, nullable=False),
    Column("updated_at_us", BigInteger, nullable=False),
)

# The current first-use window of each subject and limit. Its row is also the
# lock that serialises the opening of a new first-use window.
current_windows = Table(
    "current_windows",
    metadata,
    Column("limit_name", String(64), primary_key=True),
    Column("subject", String(200), primary_key=True),
    Column("window_start_us", BigInteger, nullable=True),
    Column("window_end_us", BigInteger, nullable=True),
)

# The ledger: one row per event id, written in the counters' transaction.
results = Table(
    "results",
    metadata,
    Column("event_id", String(128), primary_key=True),
    Column("outcome", String(16), nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("occurred_at_us", BigInteger, nullable=False),
    Column("decided_at_us", BigInteger, nullable=False),
    Column("denied_by", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("charges", Text, nullable=False),  # JSON: [ChargeDecision.to_row(), ...]
    Column("metadata", Text, nullable=True),  # JSON
)
Index("ix_results_decided_at_us", results.c.decided_at_us)
