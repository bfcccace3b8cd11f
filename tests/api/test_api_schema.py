"""schemathesis against ``/openapi.json``: generated requests, real server.

Every operation of the schema gets generated input (valid and invalid by
the schema) sent over HTTP to uvicorn; no answer may be a 5xx, and every
answer must conform to the schema: a documented status, its content type,
its body shape. The app runs on the embedded default with two limits, so
valid events meet real decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from budgets import cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from metering import Limit, Meter
from metering.api import create_api
from metering.settings import Settings

Serve = Callable[[Any], str]
# Examples per operation and mode (valid, invalid): the whole run stays well under a minute.
EXAMPLES = cases(25)
CHECKS = (
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


@pytest.fixture
def api_schema(serve_api: Serve, sqlite_url: str, tmp_path: Path) -> Iterator[Any]:
    with Meter(sqlite_url) as meter:
        meter.set_limit(Limit("api_calls", maximum=5, period="1h"))
        meter.set_limit(Limit("org_calls", maximum=10, period="10s", algorithm="token_bucket"))
        settings_ = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db")
        base = serve_api(create_api(settings_, meter=meter))
        yield schemathesis.openapi.from_url(f"{base}/openapi.json")


def test_no_5xx_and_every_answer_conforms(api_schema: Any) -> None:
    # schemathesis' own pytest loader (`from_fixture`) does not run on pytest 9:
    # each operation's strategy goes through hypothesis here instead.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {f"{o.method.upper()} {o.path}" for o in operations} >= {
        "POST /v1/events",
        "GET /v1/events/{event_id}",
        "POST /v1/check",
        "GET /v1/subjects/{subject}/usage",
        "PUT /v1/entitlements/{subject}/{limit}",
        "DELETE /v1/entitlements/{subject}/{limit}",
        "GET /v1/entitlements",
        "POST /v1/grants",
        "GET /v1/grants",
        "POST /v1/events/{event_id}/void",
        "GET /v1/corrections",
        "GET /portal",
    }
    for operation in operations:
        # Invalid input where there is a body or a query: a path segment is always a string.
        modes = [GenerationMode.POSITIVE]
        queried = any(p.location == "query" for p in operation.iter_parameters())
        if operation.method.upper() == "POST" or queried:
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            # A query alone: fewer invalid examples (a string parameter fails in few ways).
            few = mode == GenerationMode.NEGATIVE and operation.method.upper() != "POST"

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES // 5 if few else EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            def exchange(case: schemathesis.Case) -> None:
                case.call_and_validate(checks=CHECKS)

            exchange()


# A token's shape (`metering.domain.links`): four parts, any characters in each.
token_parts = st.lists(
    st.text(max_size=12) | st.sampled_from(["b3JnLTE", "1795875293"]), min_size=3, max_size=3
)


def test_the_portal_answers_any_token_shaped_link_with_a_401(api_schema: Any) -> None:
    """Generated text rarely has a token's shape: here every token has it,
    with any characters in its parts (non-ASCII, other digits), as a forger's would."""
    [portal] = [
        result.ok() for result in api_schema.get_all_operations() if result.ok().path == "/portal"
    ]

    @given(case=portal.as_strategy(), parts=token_parts)
    @settings(
        max_examples=EXAMPLES * 4,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def exchange(case: schemathesis.Case, parts: list[str]) -> None:
        case.query = {"token": ".".join(["v1", *parts])}
        answer = case.call_and_validate(checks=CHECKS)
        assert answer.status_code == 401, answer.text

    exchange()
