"""Who may call which route: the one place the API asks.

Every route depends on ``require_scope(scope)``: ``ingest`` to send usage,
``read`` to read decisions and usage, ``admin`` to manage limits,
reservations, reports and webhooks. For now every request is allowed;
API keys (``Authorization: Bearer``, hashed, revocable) replace the body
of `require_scope` and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import Depends, Request

Scope = Literal["ingest", "read", "admin"]
SCOPES: tuple[Scope, ...] = ("ingest", "read", "admin")

# Statuses a route guarded by `require_scope` may answer, for ``responses=``.
AUTH_ERRORS: tuple[int, ...] = (401, 403)


def require_scope(scope: Scope) -> Any:
    """A dependency that lets a request through only with ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def allowed(request: Request) -> None:
        # No API keys yet: every request has every scope.
        return None

    check: Callable[[Request], Awaitable[None]] = allowed
    return Depends(check)
