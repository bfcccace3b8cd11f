"""`Webhooks.update`: an endpoint's URL and message types change, the rest stays,
and the new types decide which notifications it gets; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from metering import FrozenClock, Limit, Meter
from metering.errors import InvalidInput, UnknownWebhookEndpoint
from metering.webhooks import Webhooks

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as meter:
        yield meter


def test_url_and_types_change_and_the_rest_stays(meter: Meter) -> None:
    hooks = Webhooks(meter)
    endpoint, _secret = hooks.add("https://a.example/hooks", types=["limit.denied"])
    hooks.set_enabled(endpoint.id, False)

    moved = hooks.update(endpoint.id, url="https://b.example/v2")
    assert (moved.url, moved.types) == ("https://b.example/v2", ("limit.denied",))
    retyped = hooks.update(endpoint.id, types=["limit.reset", "limit.threshold"])
    assert (retyped.url, retyped.types) == (
        "https://b.example/v2",
        ("limit.reset", "limit.threshold"),
    )
    unchanged = hooks.update(endpoint.id)
    assert unchanged == retyped == hooks.get(endpoint.id)
    assert (unchanged.enabled, unchanged.secret_masked) == (False, endpoint.secret_masked)


def test_the_new_types_decide_what_it_gets(meter: Meter) -> None:
    meter.set_limit(Limit("send", maximum=1, period="1m", thresholds=(100,)))
    hooks = Webhooks(meter)
    endpoint, _secret = hooks.add("https://a.example/hooks", types=["limit.reset"])
    hooks.update(endpoint.id, types=[])  # every type
    meter.consume("s", "send")
    meter.consume("s", "send")
    assert sorted(d.message_type for d in hooks.deliveries(endpoint_id=endpoint.id)) == [
        "limit.denied",
        "limit.threshold",
    ]


def test_bad_values_change_nothing(meter: Meter) -> None:
    hooks = Webhooks(meter)
    endpoint, _secret = hooks.add("https://a.example/hooks")
    with pytest.raises(InvalidInput) as url:
        hooks.update(endpoint.id, url="ftp://a.example/")
    assert url.value.field == "url"
    with pytest.raises(InvalidInput) as types:
        hooks.update(endpoint.id, url="https://b.example/", types=["limit.nope"])
    assert types.value.field == "types"
    assert hooks.get(endpoint.id) == endpoint
    with pytest.raises(UnknownWebhookEndpoint):
        hooks.update("ep_missing", types=[])
    with pytest.raises(InvalidInput):
        hooks.update("ep missing", types=[])
