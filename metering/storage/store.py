"""`Store`: the general engine's queries on one connection, as one object.

It is composed of the query classes of the tables it touches, each in the
module named for what it holds: `metering.storage.limits` (limit rows and
their version), `metering.storage.counters` (counters and first-use windows),
`metering.storage.results` (the results table and its row codecs) and
`metering.storage.rejected` (dead letters). Other features keep their own
stores (allowances, reservations, reports, webhooks, API keys, retention),
and the hot path has its own (`metering.storage.hot`).

The general engine's path in a transaction is: `lock_counters` (a multi-row
``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: creates missing counters,
locks all of them and returns their state), then `write_counters` and
`insert_results`. Keys are locked in sorted order so that transactions
touching overlapping counters cannot deadlock.
"""

from __future__ import annotations

from metering.storage.counters import CounterStore
from metering.storage.limits import LimitStore
from metering.storage.rejected import RejectedStore
from metering.storage.results import ResultStore


class Store(LimitStore, CounterStore, ResultStore, RejectedStore):
    """Limits, counters, windows, results and dead letters on one connection;
    the caller owns the transaction."""
