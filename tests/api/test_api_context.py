"""What the routes of one API process share (`metering/api/context.py`): the
`ApiContext` the app's lifespan makes (its settings, meter, producer and queue
lookup, which routes get through `api_context`), its pool for test pings
sized and timed from the settings, one limiter of the queued path's threads;
`broker_lookup` asks the broker whether an undecided id is on the queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metering import Limit, Meter
from metering.api import create_api
from metering.api.context import (
    INGEST_THREADS,
    MAX_TEST_PINGS,
    ApiContext,
    broker_lookup,
)
from metering.settings import DeliverySettings, Settings

InProcess = Callable[[Any], httpx.Client]  # the in_process fixture (tests/api/conftest.py)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h", window="calendar"))
        yield meter


def test_routes_share_the_context_the_lifespan_makes(
    meter: Meter, in_process: InProcess, tmp_path: Path
) -> None:
    asked: list[str] = []

    def on_queue(event_id: str) -> bool:
        asked.append(event_id)
        return event_id == "waiting"

    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
    app = create_api(settings, meter=meter, is_queued=on_queue)
    client = in_process(app)
    assert client.get("/v1/events/waiting").json() == {"status": "pending", "event_id": "waiting"}
    assert client.get("/v1/events/gone").status_code == 404
    assert asked == ["waiting", "gone"]
    context = app.state.metering
    assert isinstance(context, ApiContext)
    assert (context.settings, context.meter) == (settings, meter)


def test_test_pings_and_the_queued_paths_threads_are_bounded(meter: Meter) -> None:
    settings = Settings(meter.url, "memory://", delivery=DeliverySettings(timeout_seconds=2.5))
    context = ApiContext(settings, meter, producer=None, is_queued=lambda _: False)  # type: ignore[arg-type]
    try:
        assert (context.pings.slots, context.pings.retry_after) == (MAX_TEST_PINGS, 3)

        async def limiters() -> tuple[object, object, float]:
            first, second = context.ingest_limiter(), context.ingest_limiter()
            return first, second, first.total_tokens

        first, second, tokens = asyncio.run(limiters())
        assert first is second and tokens == INGEST_THREADS
    finally:
        context.close()


def test_the_broker_is_asked_whether_an_id_waits(
    meter: Meter, in_process: InProcess, tmp_path: Path
) -> None:
    broker = f"sqla+sqlite:///{tmp_path}/broker.db"
    client = in_process(create_api(Settings(meter.url, broker), meter=meter))
    event = {"event_id": "q-1", "subject": "org", "limit": "calls"}
    assert client.post("/v1/events", json=event).status_code == 202
    lookup = broker_lookup(broker)
    assert (lookup("q-1"), lookup("q-2")) == (True, False)
