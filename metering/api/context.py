"""What the routes of one API process share: settings, the `Meter`, the producer.

`create_api` puts an `ApiContext` on ``app.state``; routes get it with
``Depends(api_context)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from metering.meter import Meter
from metering.producer import UsageProducer
from metering.settings import Settings

# Is this event id on the queue, not yet decided? (``GET /v1/events/{id}``)
IsQueued = Callable[[str], bool]


def never_queued(event_id: str) -> bool:
    """The seam for the broker query: until the API is given one
    (``create_api(is_queued=...)``), no event is known to be queued, so an
    undecided id answers 404 rather than ``pending``."""
    return False


@dataclass
class ApiContext:
    settings: Settings
    meter: Meter
    producer: UsageProducer
    is_queued: IsQueued = never_queued


def api_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.metering
    return context
