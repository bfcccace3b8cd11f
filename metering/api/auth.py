"""Who may call which route: the one place the API asks.

Every route depends on ``require_scope(scope)``: ``ingest`` to send usage,
``read`` to read decisions and usage, ``admin`` to manage limits,
reservations, reports and webhooks (an ``admin`` key may also ingest and
read: `metering.apikeys.GRANTS`).

Keys come as ``Authorization: Bearer mk_...`` (``metering apikeys create``).
`ApiKeyAuthentication`, a middleware outside the routes, looks the key up
once per request and leaves the answer in ``request.state.api_key`` (the
per-key rate limit further in charges that key); `require_scope` decides:

* a key that is malformed, unknown or revoked: 401, always;
* no key: 401 when keys are required, that is when
  ``METERING_API_AUTH=required``, or (``auto``, the default) once any key
  was ever created; before that the API answers everyone, so a first
  ``metering serve`` works;
* a key without the scope: 403.

A customer's key (``read`` limited to one subject, ``metering apikeys
create --scope read --subject org-1``) sees that subject alone, and for it
every other subject does not exist: 404, never 403, so subjects cannot be
probed. Deny by default: a route lets such a key in only if it says how it
keeps to the subject (``require_scope(..., subjects=...)``):

* ``"path"``: the ``{subject}`` path parameter must be the key's;
* ``"query"``: a ``subject`` query parameter must be the key's, and the
  route filters by `scoped_subject` (the key's subject when none is given);
* ``"route"``: the route checks what it found (`hide_other_subjects`), as
  ``GET /v1/events/{event_id}`` does: an event of its own subject, decided.

Every other route (admin ones, listings that would mix subjects, routes
added later such as simulations) answers such a key 404.

Both answers are problem details with ``WWW-Authenticate: Bearer`` (RFC
6750). Keys are not cached: each request with a key reads its row, so a
revoked key is refused from the next request on, in every process. What is
remembered is whether any key exists: "yes" for good (key rows are never
deleted), "no" for a second (`OPEN_RECHECK_US`; at once when this process
creates one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from fastapi import Depends, Request

from metering.api.problems import ApiProblem
from metering.apikeys import SCOPES, ApiKey, ApiKeys, created_in_process
from metering.errors import MeteringError
from metering.settings import AuthMode, Scope

__all__ = [
    "AUTH_ERRORS",
    "BEARER",
    "SCOPES",
    "ApiKeyAuthentication",
    "Authenticator",
    "Identity",
    "Scope",
    "hide_other_subjects",
    "may_read",
    "require_scope",
    "scoped_subject",
]

log = logging.getLogger("metering.api")

# Statuses a route guarded by `require_scope` may answer, for ``responses=``:
# no valid key, the wrong scope, and the key's own rate limit spent.
AUTH_ERRORS: tuple[int, ...] = (401, 403, 429)
REALM: Final = 'Bearer realm="metering"'
# The OpenAPI security scheme every route names, with the scope it needs
# (`security_scheme`).
BEARER: Final = "bearer"
STATE_KEY: Final = "api_key"
# How long an open API (``auto``, no key yet) trusts that no key exists: a
# key created by another process (``metering apikeys create``) turns keys on
# within this; one created by this process, at once.
OPEN_RECHECK_US: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Identity:
    """What a request's ``Authorization`` header says: ``presented`` a bearer
    token at all, the ``key`` it is (None: none, or not a valid key), or the
    ``error`` that kept it from being looked up (the database is down)."""

    presented: bool
    key: ApiKey | None = None
    error: MeteringError | None = None


ANONYMOUS: Final = Identity(presented=False)


def bearer_token(authorization: str | None) -> str | None:
    """The token of ``Bearer TOKEN`` (scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


class Authenticator:
    """One app's keys and how it asks for them (``METERING_API_AUTH``).

    In ``auto`` mode, "no key exists" is remembered for `OPEN_RECHECK_US`
    (on the database's clock), or until this process creates a key, so an
    open API costs no query per request; "some key exists" is remembered
    for good (key rows are never deleted).
    """

    def __init__(self, keys: ApiKeys, mode: AuthMode = "auto") -> None:
        self.keys = keys
        self.mode = mode
        self._keys_exist = False
        self._none_seen: tuple[int, int] | None = None  # (at_us, created_in_process)

    def identify(self, authorization: str | None) -> Identity:
        """Look up the key of an ``Authorization`` header (blocking: a read)."""
        token = bearer_token(authorization)
        if token is None:
            return ANONYMOUS
        try:
            key = self.keys.authenticate(token) if token else None
        except MeteringError as exc:
            return Identity(presented=True, error=exc)
        if key is not None:
            self._keys_exist = True
        return Identity(presented=True, key=key)

    def known_required(self) -> bool | None:
        """`required` when it needs no query, else None."""
        if self.mode == "required" or self._keys_exist:
            return True
        seen = self._none_seen
        if seen is None or seen[1] != created_in_process():
            return None
        if not 0 <= self.keys.database.now_us() - seen[0] < OPEN_RECHECK_US:
            return None
        return False

    def required(self) -> bool:
        """Whether a request without a key is refused (blocking: may read)."""
        known = self.known_required()
        if known is not None:
            return known
        created = created_in_process()
        now_us = self.keys.database.now_us()
        self._keys_exist = self.keys.any_exist()
        self._none_seen = None if self._keys_exist else (now_us, created)
        return self._keys_exist


def security_scheme() -> dict[str, Any]:
    """`BEARER` as an OpenAPI security scheme: what its scopes are."""
    return {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "mk_...",
        "description": (
            "An API key (`metering apikeys create --scope SCOPE`). Scopes: "
            "`ingest` sends usage, `read` reads decisions and usage, `admin` manages "
            "limits, reservations, reports and webhooks and may also ingest and read. "
            "A `read` key made with `--subject` (a customer's) sees that subject alone. "
            "Until the first key is created (`METERING_API_AUTH=auto`) the API answers "
            "requests without a key."
        ),
    }


def authenticator_of(app: Any) -> Authenticator:
    found = getattr(app.state, "auth", None)
    if not isinstance(found, Authenticator):
        raise RuntimeError("the API has no Authenticator (create_api's lifespan sets it)")
    return found


async def identity_of(request: Request) -> Identity:
    """The request's `Identity`: the middleware's, or looked up now."""
    found = getattr(request.state, STATE_KEY, None)
    if isinstance(found, Identity):
        return found
    auth = authenticator_of(request.app)
    identity = await asyncio.to_thread(auth.identify, request.headers.get("authorization"))
    setattr(request.state, STATE_KEY, identity)
    return identity


def _unauthorized(detail: str, error: str | None = None) -> ApiProblem:
    challenge = REALM + (f', error="{error}"' if error else "")
    return ApiProblem("unauthorized", detail, headers={"WWW-Authenticate": challenge})


SubjectRule = Literal["path", "query", "route"]
SUBJECT_RULES: Final[tuple[SubjectRule, ...]] = ("path", "query", "route")


def not_found(what: str = "no such resource") -> ApiProblem:
    """What a customer's key gets for anything of another subject's."""
    return ApiProblem("not-found", what)


def _check_subject(request: Request, own: str, rule: SubjectRule | None) -> None:
    if rule is None:
        raise not_found()
    if rule == "path":
        if request.path_params.get("subject") != own:
            raise not_found("no such subject")
    elif rule == "query":
        asked = request.query_params.getlist("subject")
        if any(value != own for value in asked):
            raise not_found("no such subject")


def require_scope(
    scope: Scope, *, always: bool = False, subjects: SubjectRule | None = None
) -> Any:
    """A dependency that lets a request through only with a key of ``scope``;
    without a key, only while the API is open (no key yet, ``auto``), unless
    ``always`` (``/metrics`` under ``METERING_METRICS_SCOPE``). ``subjects``:
    how the route keeps a customer's key to its subject (module docstring);
    None, such a key gets 404."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if subjects is not None and subjects not in SUBJECT_RULES:
        raise ValueError(f"unknown subject rule {subjects!r}")

    async def allowed(request: Request) -> None:
        identity = await identity_of(request)
        if identity.error is not None:
            raise identity.error
        key = identity.key
        if key is None:
            if identity.presented:
                raise _unauthorized(
                    "the API key is not valid: unknown, revoked or malformed "
                    "(send Authorization: Bearer mk_...)",
                    "invalid_token",
                )
            if always:
                raise _unauthorized(
                    f"an API key of scope {scope} is required: send Authorization: Bearer mk_..."
                )
            auth = authenticator_of(request.app)
            required = auth.known_required()
            if required is None:
                required = await asyncio.to_thread(auth.required)
            if required:
                raise _unauthorized("an API key is required: send Authorization: Bearer mk_...")
            return
        if key.subject is not None:
            _check_subject(request, key.subject, subjects)
        if not key.allows(scope):
            raise ApiProblem(
                "forbidden",
                f"API key {key.id} has scope {key.scope}; this route needs {scope}",
                headers={
                    "WWW-Authenticate": f'{REALM}, error="insufficient_scope", scope="{scope}"'
                },
            )

    check: Callable[[Request], Awaitable[None]] = allowed
    return Depends(check)


async def key_subject_of(request: Request) -> str | None:
    """The subject the request's key is limited to (a customer's key), else None."""
    key = (await identity_of(request)).key
    return None if key is None else key.subject


async def scoped_subject(request: Request, subject: str | None) -> str | None:
    """The subject a listing or report of a ``subjects="query"`` route is for:
    ``subject`` as asked, or, for a customer's key, its own (404 for another)."""
    own = await key_subject_of(request)
    if own is None:
        return subject
    if subject is not None and subject != own:
        raise not_found("no such subject")
    return own


async def hide_other_subjects(request: Request, subjects: Iterable[str]) -> None:
    """404 for a customer's key when what a ``subjects="route"`` route found
    belongs to (or touches) any other subject."""
    own = await key_subject_of(request)
    if own is not None and any(s != own for s in subjects):
        raise not_found()


async def may_read(request: Request) -> bool:
    """Whether the request may see usage figures (``read`` scope): an ingest
    key's answers carry outcomes only. Without a key the route was let
    through because the API is open: it answers everything."""
    key = (await identity_of(request)).key
    return key is None or key.allows("read")


# -- the middleware ----------------------------------------------------------------

ASGIScope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[ASGIScope, Receive, Send], Awaitable[None]]


class ApiKeyAuthentication:
    """Identify each HTTP request's key before anything charges it.

    Refuses nothing itself: `require_scope` does. A request with no
    ``Authorization`` header costs nothing here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            authorization = _header(scope, b"authorization")
            identity = ANONYMOUS
            if authorization is not None:
                auth = authenticator_of(scope["app"])
                identity = await asyncio.to_thread(auth.identify, authorization)
            scope.setdefault("state", {})[STATE_KEY] = identity
        await self.app(scope, receive, send)


def _header(scope: ASGIScope, name: bytes) -> str | None:
    for raw_name, raw_value in scope.get("headers", ()):
        if raw_name.lower() == name:
            value: str = raw_value.decode("latin-1")
            return value
    return None


def key_subject(identity: object) -> str | None:
    """The subject a request is charged to for the API's own rate: its key's id."""
    if isinstance(identity, Identity) and identity.key is not None:
        return f"apikey:{identity.key.id}"
    return None
