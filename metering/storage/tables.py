"""The schema, as SQLAlchemy Core tables.

Instants are BIGINT microseconds since the Unix epoch in every dialect: exact,
cheap to compare, and the same arithmetic on PostgreSQL and SQLite.
Alembic migrations in ``migrations/`` must produce exactly this schema (a test
compares them). Columns of one type share one type object (`BIGINT`, `string`):
each new engine's dialect adapts a type object once, on its first statement.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData()

# SQLAlchemy remembers, per dialect, what it made of each type object: a
# column's own ``BigInteger()`` would be adapted again for every new engine,
# in every statement that is the first of its columns. Not for schema types
# (`Boolean`), which attach themselves to their column.
BIGINT: Final = BigInteger()
INTEGER: Final = Integer()
TEXT: Final = Text()
DOUBLE: Final = Double[float]()


@functools.cache
def string(length: int) -> String:
    """The one ``String(length)`` of the tables' columns."""
    return String(length)


limits = Table(
    "limits",
    metadata,
    Column("name", string(64), primary_key=True),
    Column("maximum", BIGINT, nullable=False),
    Column("period", string(16), nullable=False),
    Column("algorithm", string(16), nullable=False),
    Column("window", string(16), nullable=False),
    Column("enforcement", string(8), nullable=False),
    Column("thresholds", TEXT, nullable=False),  # JSON list of percentages
    Column("lateness", string(16), nullable=False),
    Column("updated_at_us", BIGINT, nullable=False),
    # JSON list of the metadata keys usage is rolled up by (migration 0009).
    Column("dimensions", TEXT, nullable=False, server_default="[]"),
    Column("thresholds_units", TEXT, nullable=False, server_default="[]"),  # JSON list
    # A spend limit's ISO 4217 code (migration 0015): its amounts are minor units.
    Column("currency", string(3), nullable=True),
    # Seats: the metadata key whose distinct values the limit counts (migration 0013).
    Column("distinct_key", string(64), nullable=True),
    # sum, or a gauge's max or latest (migration 0023).
    Column("aggregation", string(8), nullable=False, server_default="sum"),
    # A paced limit's burst, units or "P%" (`metering.domain.pacing`); NULL: not paced.
    Column("pacing_burst", string(24), nullable=True),
    Column("forecast_lead", string(32), nullable=True),  # a duration, "24h"; NULL: none
    # The runaway breaker (migration 0029): its factor ("10x"), the floor of the
    # baseline in units per second, the quarantine maximum; NULL: no breaker.
    Column("breaker", string(8), nullable=True),
    Column("breaker_floor", DOUBLE, nullable=True),
    Column("quarantine_max", BIGINT, nullable=True),
)

# A limit's dimensions from the reset clock's ``tick`` on (migration 0047): a
# row per change of them and per first definition, kept when the limit is
# deleted (`metering.domain.dimension_history`); ``seeded``: by the migration.
limit_dimensions = Table(
    "limit_dimensions",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("tick", BIGINT, nullable=False, autoincrement=False),
    Column("since_us", BIGINT, nullable=False),
    Column("dimensions", TEXT, nullable=False),  # JSON list of metadata keys
    Column("seeded", Boolean, nullable=False, server_default=false()),
    Column("distinct_key", string(64), nullable=True),  # its seat key (migration 0049)
    Column("aggregation", string(8), nullable=True),  # sum, max or latest (migration 0050)
    PrimaryKeyConstraint("limit_name", "tick"),
)

# A limit's default maximum and enforcement from ``effective_from_us`` on (migration
# 0051): a row per change of either and per first definition, never updated, kept
# when the limit is deleted; reports take the row in force at a window's end
# (`metering.domain.definitions`). The migration's rows start at 0: from the beginning.
limit_definitions = Table(
    "limit_definitions",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("effective_from_us", BIGINT, nullable=False, autoincrement=False),
    Column("maximum", BIGINT, nullable=False),
    Column("enforcement", string(8), nullable=False),
    PrimaryKeyConstraint("limit_name", "effective_from_us"),
)

# One row per subject and limit with a breaker (`metering.domain.breaker`):
# its now and baseline rates, the start of its history, since when the now
# rate is past the multiple, and since when it is quarantined (NULL: it is not).
breakers = Table(
    "breakers",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("short_rate", DOUBLE, nullable=False),
    Column("long_rate", DOUBLE, nullable=False),
    Column("rate_at_us", BIGINT, nullable=False),
    Column("since_us", BIGINT, nullable=False),
    Column("over_since_us", BIGINT, nullable=True),
    Column("quarantined_at_us", BIGINT, nullable=True),
    PrimaryKeyConstraint("subject", "limit_name"),
    postgresql_with={"fillfactor": 50},  # room for HOT updates (migration 0035)
)

# One row (id 1): incremented by every change to ``limits``, so that processes
# caching limits see a change in the same statement that needs them.
limits_version = Table(
    "limits_version",
    metadata,
    Column("id", INTEGER, primary_key=True, autoincrement=False),
    Column("version", BIGINT, nullable=False),
)

# One row per subject, limit and window; rows of past windows stay for reports.
# A token bucket has a single row with window_start_us = window_end_us = 0.
counters = Table(
    "counters",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("window_start_us", BIGINT, nullable=False, autoincrement=False),
    Column("window_end_us", BIGINT, nullable=False),
    Column("used", BIGINT, nullable=False),
    Column("denied_count", BIGINT, nullable=False),
    Column("denied_cost", BIGINT, nullable=False),
    Column("first_denied_at_us", BIGINT, nullable=True),
    Column("tat_us", BIGINT, nullable=True),
    Column("tat_rem", BIGINT, nullable=False),
    Column("tat_scale", BIGINT, nullable=False),
    Column("updated_at_us", BIGINT, nullable=False),
    # The recent rate in units per second as of rate_at_us, moved by every
    # write that adds to ``used`` (`metering.storage.rates`, migration 0028).
    Column("rate", DOUBLE, nullable=False, server_default="0"),
    Column("rate_at_us", BIGINT, nullable=False, server_default="0"),
    # The window's billing month (``2026-11``), the local month of its start in
    # the subject's zone (`metering.domain.zones.billing_month`), written when
    # the row is made (migration 0030); NULL for a token bucket (no window).
    Column("billing_month", string(7), nullable=True),
    # What the window drew on its subject's grants (`metering.domain.grants.Pot`):
    # its own usage is ``used`` less this (migration 0038).
    Column("granted", BIGINT, nullable=False, server_default="0"),
    # A seat limit's window: a random stamp written by a trigger on
    # ``distinct_values`` at every change of its held values, never reused;
    # NULL until the first (migration 0041, `metering.engine.seats.HeldCache`).
    Column("seats_stamp", BIGINT, nullable=True),
    # Keys lead with the subject (migration 0006): see docs/performance.md.
    PrimaryKeyConstraint("subject", "limit_name", "window_start_us"),
    postgresql_with={"fillfactor": 70},  # room for HOT updates (migration 0005)
)

# The current first-use window of each subject and limit. Its row is also the
# lock that serialises the opening of a new first-use window.
current_windows = Table(
    "current_windows",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("window_start_us", BIGINT, nullable=True),
    Column("window_end_us", BIGINT, nullable=True),
    PrimaryKeyConstraint("subject", "limit_name"),
    postgresql_with={"fillfactor": 70},
)

# The ledger: one row per event id, written in the counters' transaction.
results = Table(
    "results",
    metadata,
    Column("event_id", string(128), primary_key=True),
    Column("outcome", string(16), nullable=False),
    Column("fingerprint", TEXT, nullable=False),
    Column("occurred_at_us", BIGINT, nullable=False),
    Column("decided_at_us", BIGINT, nullable=False),
    Column("denied_by", TEXT, nullable=True),
    Column("reason", TEXT, nullable=True),
    Column("charges", TEXT, nullable=False),  # JSON: [ChargeDecision.to_row(), ...]
    Column("metadata", TEXT, nullable=True),  # JSON
    # The reset clock's tick when the result was written (`reset_clock`).
    Column("reset_tick", BIGINT, nullable=False, server_default="0"),
)
# What the audit reads of the results decided since its last run (migration
# 0025): on PostgreSQL a BRIN index (a few pages, next to nothing per insert:
# results arrive in about the order of their decision), on SQLite a B-tree
# appended to at its right edge.
Index("ix_results_decided_at_us", results.c.decided_at_us, postgresql_using="brin")


def _rollup_columns() -> list[Column[Any]]:
    """A rollup row's columns (key, then figures): the rollups' and their deltas'."""
    return [
        Column("subject", string(200), nullable=False),
        Column("limit_name", string(64), nullable=False),
        Column("dimension", string(64), nullable=False),
        Column("hour_start_us", BIGINT, nullable=False, autoincrement=False),
        Column("value", string(200), nullable=False),
        Column("used", BIGINT, nullable=False),
        Column("events", BIGINT, nullable=False),
    ]


# Usage by dimension (migration 0009): per subject, limit, metadata key, hour
# and value, the cost consumed and the events that consumed it; written with
# the counters (`metering.storage.rollups`). The key leads with the subject,
# as the counters' does, and serves `metering report usage --group-by`, which
# reads a heap page per row; the figures are not in the key, so a batch's
# update of them is HOT (migration 0037; docs/performance.md).
usage_rollups = Table(
    "usage_rollups",
    metadata,
    *_rollup_columns(),
    PrimaryKeyConstraint(
        "subject",
        "limit_name",
        "dimension",
        "hour_start_us",
        "value",
    ),
    postgresql_with={"fillfactor": 50},  # room for HOT updates (migration 0037)
)

# What a hot-path batch adds to the rollups, appended (migration 0040): no key,
# no index, no conflict to check. Readers sum it with ``usage_rollups``
# (`metering.storage.rollups.ROLLUPS`); `compact_rollups` folds it in.
usage_rollup_deltas = Table(
    "usage_rollup_deltas",
    metadata,
    *_rollup_columns(),
)

# Queued input that could not become an event (malformed, or an id reused
# with other charges): kept with its error so nothing disappears silently.
# ``digest`` (SHA-256 of reason and input) makes a redelivered message a no-op.
rejected_messages = Table(
    "rejected_messages",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("digest", string(64), nullable=False, unique=True),
    Column("event_id", string(128), nullable=True),
    Column("reason", TEXT, nullable=False),
    Column("raw", TEXT, nullable=False),
    Column("received_at_us", BIGINT, nullable=False),
)
Index("ix_rejected_messages_received_at_us", rejected_messages.c.received_at_us)


# Reservations: usage consumed now that may still be given back. The id is
# the reserving event's id (its result is in ``results``). ``charges`` is a
# JSON list of [subject, limit, cost, window_start_us, window_end_us]: the
# counters to give back to on cancel. State: held, committed or cancelled.
reservations = Table(
    "reservations",
    metadata,
    Column("id", string(128), primary_key=True),
    Column("state", string(12), nullable=False),
    Column("charges", TEXT, nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    Column("expires_at_us", BIGINT, nullable=False),
    Column("settled_at_us", BIGINT, nullable=True),
    Column("settled_by", string(16), nullable=True),  # cancel, commit, sweeper, void
    # JSON list of [subject, limit, window_start_us]: the counters a cancel (or
    # a void of a held reservation) gave the cost back to (migration 0011), so
    # that a later void reverses only what is still charged.
    Column("given_back", TEXT, nullable=True),
    # Whether a reset dropped some of its charges from the hold (migration
    # 0046): a settle then needs the result to say what they were.
    Column("hold_cleared", Boolean, nullable=False, server_default=false()),
)
Index("ix_reservations_state_expires", reservations.c.state, reservations.c.expires_at_us)
# What the audit reads of the reservations settled since its last run (migration 0025).
Index("ix_reservations_settled_at_us", reservations.c.settled_at_us)

# Usage a commit recorded beyond a hard limit (migration 0017): per event and
# counter, the units there was no room for, billed anyway. The overage report
# sums them per window as ``overdraft``, leaving out voided events, and bills
# no more than the window's usage past the maximum it shows; a reset
# deletes those of the counters it clears.
overdrafts = Table(
    "overdrafts",
    metadata,
    Column("event_id", string(128), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("window_start_us", BIGINT, nullable=False, autoincrement=False),
    Column("units", BIGINT, nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    PrimaryKeyConstraint("event_id", "subject", "limit_name"),
)
Index(
    "ix_overdrafts_counter",
    overdrafts.c.subject,
    overdrafts.c.limit_name,
    overdrafts.c.window_start_us,
)

# Floating licenses (`metering.licenses`, migration 0014). A checkout holds
# ``cost`` units of a concurrent limit until checked in or until
# ``expires_at_us``: what a subject holds is the sum of its held, unexpired
# checkouts, so an expired one stops counting at its TTL whether or not the
# sweep has marked it yet. ``released_by``: checkin or expiry.
checkouts = Table(
    "checkouts",
    metadata,
    Column("id", string(128), primary_key=True),
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("cost", BIGINT, nullable=False),
    Column("state", string(12), nullable=False),  # held, released
    Column("created_at_us", BIGINT, nullable=False),
    Column("ttl_us", BIGINT, nullable=False),
    Column("expires_at_us", BIGINT, nullable=False),
    Column("released_at_us", BIGINT, nullable=True),
    Column("released_by", string(16), nullable=True),
)
Index("ix_checkouts_pair_state", checkouts.c.subject, checkouts.c.limit_name, checkouts.c.state)
Index("ix_checkouts_state_expires", checkouts.c.state, checkouts.c.expires_at_us)

# One row per subject and concurrent limit: the lock that serialises its
# checkouts (so two cannot both take the last license), and whether a
# denial was announced since the last checkout that fitted (``limit.denied``
# once per run of denials, as a window's first denial).
license_pools = Table(
    "license_pools",
    metadata,
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("denied_at_us", BIGINT, nullable=True),
    Column("updated_at_us", BIGINT, nullable=False),
    PrimaryKeyConstraint("subject", "limit_name"),
)

# Operators' resets: one row per counter cleared, with the reset clock's tick
# and the time. A void skips a charge whose counter a reset with a greater
# tick than the event's result cleared: that usage went with the reset.
# Rows of earlier versions have no tick or window (every window open at
# their time) and may have no subject or limit (every subject, every limit).
counter_resets = Table(
    "counter_resets",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("subject", string(200), nullable=True),
    Column("limit_name", string(64), nullable=True),
    Column("reset_at_us", BIGINT, nullable=False),
    Column("window_start_us", BIGINT, nullable=True),
    Column("tick", BIGINT, nullable=True),
)
Index("ix_counter_resets_reset_at_us", counter_resets.c.reset_at_us)
Index(
    "ix_counter_resets_counter",
    counter_resets.c.subject,
    counter_resets.c.limit_name,
    counter_resets.c.tick,
)

# One row (id 1): a logical clock every reset advances while it holds the
# locks of the counters it clears. A result records the tick it was written
# at (``results.reset_tick``), after its own counters were locked, so a reset
# and an event on one counter are ordered by which was written first,
# whatever their clocks said. A change of a limit's dimensions advances it
# too (``limit_dimensions``).
reset_clock = Table(
    "reset_clock",
    metadata,
    Column("id", INTEGER, primary_key=True, autoincrement=False),
    Column("tick", BIGINT, nullable=False),
)

# -- entitlements, grants, corrections (metering.domain.grants) ----------------
# A subject's own maximum for a limit from ``effective_from_us`` on: rows are
# history, never updated; a NULL maximum returns the subject to the default.
entitlements = Table(
    "entitlements",
    metadata,
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("effective_from_us", BIGINT, nullable=False, autoincrement=False),
    Column("maximum", BIGINT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
    PrimaryKeyConstraint("subject", "limit_name", "effective_from_us"),
)

# A subject's changes of time zone (`metering.domain.zones`), oldest first by ``since_us``.
subject_time_zones = Table(
    "subject_time_zones",
    metadata,
    Column("subject", string(200), nullable=False),
    Column("since_us", BIGINT, nullable=False, autoincrement=False),
    Column("time_zone", string(64), nullable=False),
    PrimaryKeyConstraint("subject", "since_us"),
)

# Top-ups: ``amount`` on top of the maximum, ``used`` of it so far, active
# from ``effective_from_us`` until ``expires_at_us`` (exclusive; NULL: never).
grants = Table(
    "grants",
    metadata,
    Column("grant_id", string(128), primary_key=True),
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("amount", BIGINT, nullable=False),
    Column("used", BIGINT, nullable=False),
    Column("effective_from_us", BIGINT, nullable=False),
    Column("expires_at_us", BIGINT, nullable=True),
    Column("reason", TEXT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
    # The PostgreSQL hot path reads balances without a lock and relies on this
    # check to refuse a draw planned on a balance another transaction spent.
    CheckConstraint("used >= 0 AND used <= amount", name="ck_grants_used"),
    # Drawn by priority (lowest first), then by expiry (`metering.domain.grants`).
    Column("priority", INTEGER, nullable=False, server_default="100"),
    # An issue of a recurring grant: its schedule and number (1 is the first).
    Column("schedule_id", string(128), nullable=True),
    Column("issue_number", INTEGER, nullable=True),
    # ``grant.low`` when what is left falls to this (NULL: never); sent once.
    Column("low_at", BIGINT, nullable=True),
    Column("low_sent", Boolean, nullable=False, server_default=false()),
    postgresql_with={"fillfactor": 50},  # room for HOT updates (migration 0035)
)
Index("ix_grants_subject_limit", grants.c.subject, grants.c.limit_name)

# Recurring grants (`metering.domain.recurring`): each issue is a row of
# ``grants``; ``next_issue_us`` is when the next is due (NULL: never again).
grant_schedules = Table(
    "grant_schedules",
    metadata,
    Column("schedule_id", string(128), primary_key=True),
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("amount", BIGINT, nullable=False),
    Column("every", string(32), nullable=False),
    Column("calendar", Boolean, nullable=False),
    Column("rollover_max", BIGINT, nullable=False),
    Column("priority", INTEGER, nullable=False),
    Column("until_us", BIGINT, nullable=True),
    Column("low_units", BIGINT, nullable=True),
    Column("low_percent", INTEGER, nullable=True),
    Column("last_issue", INTEGER, nullable=False),
    Column("next_issue_us", BIGINT, nullable=True),
    Column("reason", TEXT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
)
Index("ix_grant_schedules_subject_limit", grant_schedules.c.subject, grant_schedules.c.limit_name)

# One subject's thresholds for one limit, replacing the limit's (JSON lists).
alert_thresholds = Table(
    "alert_thresholds",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("thresholds", TEXT, nullable=False),
    Column("thresholds_units", TEXT, nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    PrimaryKeyConstraint("limit_name", "subject"),
)

# Voided events: one correction per event id. ``charges`` is a JSON list of
# [subject, limit, cost, window_start_us, [[grant_id, restored], ...]].
corrections = Table(
    "corrections",
    metadata,
    Column("correction_id", string(128), primary_key=True),
    Column("event_id", string(128), nullable=False),
    Column("reason", TEXT, nullable=False),
    Column("charges", TEXT, nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    UniqueConstraint("event_id", name="uq_corrections_event_id"),
)
Index("ix_corrections_created_at_us", corrections.c.created_at_us)

# -- seats (metering.domain.distinct) ------------------------------------------
# Per window of a distinct limit, each value seen and how many live (allowed,
# not voided) events carried it: 1 for one or more (migration 0039), 0 once the
# last is voided. A value holds a seat while its count is above zero. Written in the transaction
# that changes the window's counter, and only after that counter's row is
# locked (the counter's lock serialises them).
distinct_values = Table(
    "distinct_values",
    metadata,
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("window_start_us", BIGINT, nullable=False, autoincrement=False),
    Column("value", string(200), nullable=False),
    Column("live_events", BIGINT, nullable=False),
    PrimaryKeyConstraint("subject", "limit_name", "window_start_us", "value"),
    CheckConstraint("live_events >= 0", name="ck_distinct_values_live_events"),
    postgresql_with={"fillfactor": 50},  # room for HOT updates (migration 0037)
)

# -- webhooks ----------------------------------------------------------------
# Endpoints: where notifications go. ``types`` is a JSON list of message
# types (empty: every type). During a rotation's grace ``previous_secret``
# still signs, until ``previous_expires_at_us``.
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("id", string(32), primary_key=True),
    Column("url", TEXT, nullable=False),
    Column("secret", TEXT, nullable=False),
    Column("previous_secret", TEXT, nullable=True),
    Column("previous_expires_at_us", BIGINT, nullable=True),
    Column("types", TEXT, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("disabled_reason", TEXT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
)

# Once-per-window marks: the primary key makes a notification happen once
# however many workers decide events of the same window. ``due_at_us``: when
# the reset sweeper must look at the mark (a denied window's end, a bucket
# full again); NULL when it never must.
webhook_marks = Table(
    "webhook_marks",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("subject", string(200), nullable=False),
    Column("window_start_us", BIGINT, nullable=False, autoincrement=False),
    Column("kind", string(32), nullable=False),
    Column("window_end_us", BIGINT, nullable=False),
    Column("maximum", BIGINT, nullable=False),
    Column("event_id", string(128), nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
    Column("due_at_us", BIGINT, nullable=True),
    PrimaryKeyConstraint("subject", "limit_name", "window_start_us", "kind"),
)
Index("ix_webhook_marks_due_at_us", webhook_marks.c.due_at_us)

# The outbox: one row per notification, written in the counters' transaction.
webhook_messages = Table(
    "webhook_messages",
    metadata,
    Column("id", string(40), primary_key=True),
    Column("type", string(32), nullable=False),
    Column("payload", TEXT, nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
)

# One delivery per (message, endpoint), fanned out with the message. State:
# pending, delivered or failed. A worker claims a due delivery by setting
# ``claim_token`` and a lease (``claimed_until_us``) that a crash lets expire.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("message_id", string(40), nullable=False),
    Column("endpoint_id", string(32), nullable=False),
    Column("status", string(12), nullable=False),
    Column("attempts", INTEGER, nullable=False),
    Column("next_attempt_at_us", BIGINT, nullable=True),
    Column("claim_token", string(32), nullable=True),
    Column("claimed_until_us", BIGINT, nullable=True),
    Column("last_status_code", INTEGER, nullable=True),
    Column("last_error", TEXT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
    Column("updated_at_us", BIGINT, nullable=False),
)
Index(
    "ix_webhook_deliveries_due",
    webhook_deliveries.c.status,
    webhook_deliveries.c.next_attempt_at_us,
)
Index("ix_webhook_deliveries_endpoint", webhook_deliveries.c.endpoint_id)

# Every attempt of a delivery: HTTP status (NULL when none came back),
# duration, error, and when the next attempt is due (NULL: none).
webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("delivery_id", BIGINT, nullable=False),
    Column("attempt", INTEGER, nullable=False),
    Column("attempted_at_us", BIGINT, nullable=False),
    Column("status_code", INTEGER, nullable=True),
    Column("duration_ms", INTEGER, nullable=False),
    Column("error", TEXT, nullable=True),
    Column("next_attempt_at_us", BIGINT, nullable=True),
)
Index("ix_webhook_attempts_delivery_id", webhook_attempts.c.delivery_id)

# -- liveness ----------------------------------------------------------------
# When each worker (role ``worker``, named by its Celery node name) and beat
# (role ``beat``) last said it was alive; written about every 10 s, read by
# `metering status`. Rows of processes gone for a week are deleted.
heartbeats = Table(
    "heartbeats",
    metadata,
    Column("role", string(16), nullable=False),
    Column("name", string(200), nullable=False),
    Column("seen_at_us", BIGINT, nullable=False),
    PrimaryKeyConstraint("role", "name"),
)

# -- API keys ----------------------------------------------------------------
# Keys of the HTTP API (``metering apikeys``): the id is the visible start of
# the key (``mk_`` + 12 hex digits), ``secret_hash`` the SHA-256 of the whole
# key; the key itself is never stored. Scope: ingest, read or admin. Rows
# stay when revoked (``revoked_at_us``); ``last_used_at_us`` is written at
# most once a minute per key.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", string(32), primary_key=True),
    Column("secret_hash", string(64), nullable=False),
    Column("scope", string(16), nullable=False),
    Column("name", string(200), nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    Column("revoked_at_us", BIGINT, nullable=True),
    Column("last_used_at_us", BIGINT, nullable=True),
    # A customer's key (migration 0020): a read key that sees only this subject.
    Column("subject", string(200), nullable=True),
)

# Secrets the product makes for itself (migration 0020), by name: the HMAC
# key of the usage page's signed links (``portal``), made on first use; the
# one a rotation replaced (``portal.previous``) until ``expires_at_us``
# (migration 0021; NULL: without end).
secrets = Table(
    "secrets",
    metadata,
    Column("name", string(64), primary_key=True),
    Column("value", string(128), nullable=False),
    Column("created_at_us", BIGINT, nullable=False),
    Column("expires_at_us", BIGINT, nullable=True),
)


# -- prices (metering.domain.money) ---------------------------------------------
# A limit's price per unit, in micro-minor units of ``currency``, from
# ``effective_from_us`` on: rows are history; a NULL price ends pricing.
prices = Table(
    "prices",
    metadata,
    Column("limit_name", string(64), nullable=False),
    Column("effective_from_us", BIGINT, nullable=False, autoincrement=False),
    Column("currency", string(3), nullable=False),
    Column("per_unit", BIGINT, nullable=True),
    Column("created_at_us", BIGINT, nullable=False),
    # A tiered price (migration 0026): its model, tiers (JSON), package and flat fee.
    Column("model", string(16), nullable=False, server_default="per_unit"),
    Column("tiers", TEXT, nullable=True),
    Column("package_size", BIGINT, nullable=True),
    Column("per_package", BIGINT, nullable=True),
    Column("flat_fee", BIGINT, nullable=False, server_default="0"),
    PrimaryKeyConstraint("limit_name", "effective_from_us"),
)


# -- the audit (metering.upkeep.audit, migration 0025) ---------------------------------
# Instants the audit keeps (by name): ``checked_to`` (the last run's
# watermark: results, voids, give-backs and resets up to it are in
# ``audit_windows``), ``results_pruned_before`` (retention's cut-off, so a
# full audit leaves alone the windows whose results are gone).
audit_marks = Table(
    "audit_marks",
    metadata,
    Column("name", string(32), primary_key=True),
    Column("at_us", BIGINT, nullable=False),
)

# Per window, what the ledger says it holds, up to ``checked_to``: the sum of
# its charges less voids and give-backs, and the largest maximum in force
# any of its charges saw. An incremental run adds what came since.
audit_windows = Table(
    "audit_windows",
    metadata,
    Column("subject", string(200), nullable=False),
    Column("limit_name", string(64), nullable=False),
    Column("window_start_us", BIGINT, nullable=False, autoincrement=False),
    Column("used", BIGINT, nullable=False),
    Column("maximum", BIGINT, nullable=False),
    PrimaryKeyConstraint("subject", "limit_name", "window_start_us"),
)

# The last runs (the latest few kept): what they checked and what they found
# (``violations``: a JSON list of `metering.domain.audit.Violation.to_dict`).
audit_runs = Table(
    "audit_runs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("ran_at_us", BIGINT, nullable=False),
    Column("checked_from_us", BIGINT, nullable=True),
    Column("checked_to_us", BIGINT, nullable=False),
    Column("full", Boolean, nullable=False),
    Column("windows", BIGINT, nullable=False),
    Column("violations", TEXT, nullable=False),
)
