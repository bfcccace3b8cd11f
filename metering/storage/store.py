"""`Store`: the general engine's queries on one connection, as one object.

It is composed of the query classes of the tables it touches: `metering.storage.limits`
(limit rows and their version), `metering.storage.counters` (counters and first-use
windows), `metering.storage.results` (results and their row codecs) and
`metering.storage.rejected` (dead letters); other features keep their own stores, and the
hot path its own (`metering.storage.hot`). In a transaction the general path runs
`lock_counters` (one multi-row ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: creates
missing counters, locks them all, returns their state), then `write_counters` and
`insert_results`. Keys are locked in sorted order, so overlapping transactions cannot deadlock.
"""

from __future__ import annotations

from metering.storage.counters import CounterStore
from metering.storage.limits import LimitStore
from metering.storage.rejected import RejectedStore
from metering.storage.results import ResultStore


class Store(LimitStore, CounterStore, ResultStore, RejectedStore):
    """Limits, counters, windows, results and dead letters on one connection;
    the caller owns the transaction."""
