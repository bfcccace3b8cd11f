"""`route`: how the API's routes are declared, in one place.

Every route but ``/portal`` answers a JSON (or streamed) body it builds by
hand (no ``response_model``), asks a scope (`metering.api.auth.require_scope`)
and documents its answers: its own (``ok``: the model and description of each
success, and any problem with members of its own), then a problem under each
status it may answer (``errors``), the scope's (`AUTH_ERRORS`) and those every
route may answer (`COMMON_ERRORS`), then ``more`` (problems documented with
members of their own, after the others). Its ``security`` names the scope
under the API's bearer scheme (`BEARER`, declared by `metering.api.app`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from metering.api.auth import AUTH_ERRORS, BEARER, Scope, SubjectRule, require_scope
from metering.api.problems import COMMON_ERRORS, responses

Handler = TypeVar("Handler", bound=Callable[..., Any])
# ``responses=`` entries: status -> what is answered under it.
Answers = Mapping[int, Mapping[str, Any]]


def route(
    declare: Callable[..., Callable[[Handler], Handler]],
    path: str,
    summary: str,
    *,
    scope: Scope,
    ok: Answers,
    errors: tuple[int, ...] = (),
    more: Answers | None = None,
    subjects: SubjectRule | None = None,
    **options: Any,
) -> Callable[[Handler], Handler]:
    """The decorator ``declare`` (``router.get``, ``router.post`` ...) makes for
    ``path``, documented as the module docstring says; ``options`` (``status_code``,
    ``openapi_extra``) go to it as they are, ``openapi_extra`` with the security."""
    extra = {**options.pop("openapi_extra", {}), "security": [{BEARER: [scope]}]}
    return declare(
        path,
        summary=summary,
        response_model=None,
        responses={
            **ok,
            **responses(*errors, *AUTH_ERRORS, *COMMON_ERRORS),
            **(more or {}),
        },
        dependencies=[require_scope(scope, subjects=subjects)],
        openapi_extra=extra,
        **options,
    )
