"""The schema, as SQLAlchemy Core tables.

Instants are BIGINT microseconds since the Unix epoch in every dialect: exact,
cheap to compare, and the same arithmetic on PostgreSQL and SQLite.
Alembic migrations in ``migrations/`` must produce exactly this schema (a test
compares them).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Table, Text

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

# Queued input that could not become an event (malformed, or an id reused
# with other charges): kept with its error so nothing disappears silently.
# ``digest`` (SHA-256 of reason and input) makes a redelivered message a no-op.
rejected_messages = Table(
    "rejected_messages",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("event_id", String(128), nullable=True),
    Column("reason", Text, nullable=False),
    Column("raw", Text, nullable=False),
    Column("received_at_us", BigInteger, nullable=False),
)
Index("ix_rejected_messages_received_at_us", rejected_messages.c.received_at_us)

# Reports read counters by period and by subject across limits.
Index("ix_counters_window_start_us", counters.c.window_start_us)
Index("ix_counters_subject", counters.c.subject, counters.c.limit_name, counters.c.window_start_us)

# Reservations: usage consumed now that may still be given back. The id is
# the reserving event's id (its result is in ``results``). ``charges`` is a
# JSON list of [subject, limit, cost, window_start_us, window_end_us]: the
# counters to give back to on cancel. State: held, committed or cancelled.
reservations = Table(
    "reservations",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("state", String(12), nullable=False),
    Column("charges", Text, nullable=False),
    Column("created_at_us", BigInteger, nullable=False),
    Column("expires_at_us", BigInteger, nullable=False),
    Column("settled_at_us", BigInteger, nullable=True),
    Column("settled_by", String(16), nullable=True),  # cancel, commit, sweeper
)
Index("ix_reservations_state_expires", reservations.c.state, reservations.c.expires_at_us)
