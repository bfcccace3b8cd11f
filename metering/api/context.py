"""What the routes of one API process share: settings, the `Meter`, the producer.

`create_api` puts an `ApiContext` on ``app.state``; routes get it with
``Depends(api_context)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated

from anyio import CapacityLimiter
from fastapi import Depends
from starlette.requests import Request

from metering.api.offload import Offload
from metering.meter import Meter
from metering.pipeline.producer import UsageProducer
from metering.settings import Settings
from metering.storage.queue_state import is_queued

# Is this event id on the queue, not yet decided? (``GET /v1/events/{id}``)
IsQueued = Callable[[str], bool]


def broker_lookup(broker_url: str) -> IsQueued:
    """Ask the broker at ``broker_url`` (`metering.storage.queue_state.is_queued`,
    as ``metering result`` does): waiting or taken by a worker, not yet applied."""
    return partial(is_queued, broker_url)


# Webhook test pings running at once, per server process (each waits for its
# receiver up to the delivery timeout); more are answered 429.
MAX_TEST_PINGS = 4
# Queued ``POST /v1/events`` requests looking their ids up and publishing at
# once, per server process; more wait their turn. Fewer than the database
# pool's connections (5 kept open on PostgreSQL): more would open and close
# a connection for each request (a third of the ledger lookup's cost,
# measured), and two cores gain nothing from more threads.
INGEST_THREADS = 4


@dataclass
class ApiContext:
    settings: Settings
    meter: Meter
    producer: UsageProducer
    is_queued: IsQueued
    # Test pings run here, off the threads every route shares (`Offload`).
    pings: Offload = field(init=False)
    _ingest: CapacityLimiter | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.pings = Offload(
            MAX_TEST_PINGS,
            what="webhook test ping",
            retry_after_seconds=self.settings.delivery.timeout_seconds,
        )

    def ingest_limiter(self) -> CapacityLimiter:
        """The threads of the queued path (`INGEST_THREADS`), made in the event loop."""
        if self._ingest is None:
            self._ingest = CapacityLimiter(INGEST_THREADS)
        return self._ingest

    def close(self) -> None:
        self.pings.close()


def api_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.metering
    return context


# What a route declares to get the context: ``context: Context``.
Context = Annotated[ApiContext, Depends(api_context)]
