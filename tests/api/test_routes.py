"""`metering.api.routes.route`: how every API route is declared."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from starlette.responses import Response

from metering.api.problems import PROBLEM_JSON
from metering.api.routes import route


def test_a_route_documents_its_answers_its_problems_the_scopes_and_the_common_ones() -> None:
    router = APIRouter()
    own = {"description": "Settled.", "content": {PROBLEM_JSON: {"schema": {}}}}

    @route(
        router.post,
        "/things/{thing}",
        "Do a thing",
        scope="admin",
        ok={201: {"description": "Done."}},
        errors=(400, 404),
        more={409: own},
        status_code=201,
    )
    async def do_thing(thing: str) -> Response:
        return Response(status_code=201)

    app = FastAPI()
    app.include_router(router)
    operation = app.openapi()["paths"]["/things/{thing}"]["post"]
    assert operation["summary"] == "Do a thing"
    documented = [status for status in operation["responses"] if status != "422"]  # FastAPI's
    common = ["401", "403", "429", "408", "413", "500", "503"]
    assert documented == ["201", "400", "404", *common, "409"]
    assert operation["responses"]["409"]["description"] == "Settled."
    (declared,) = [r for r in router.routes if getattr(r, "name", None) == "do_thing"]
    assert declared.response_model is None  # type: ignore[attr-defined]
    assert len(declared.dependencies) == 1  # type: ignore[attr-defined]  # require_scope
