"""WSGI middleware (Flask, Django, and any WSGI application).

    app.wsgi_app = WSGIMeteringMiddleware(app.wsgi_app, meter=meter, limit="api")

The outermost wrapper runs first. Handlers find the request's charges in
``environ["metering"]`` (Flask: ``request.environ["metering"]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from metering.middleware.core import (
    Middleware,
    RequestInfo,
    RequestMetering,
)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
ENVIRON_KEY = "metering"
REASONS = {429: "Too Many Requests", 503: "Service Unavailable"}


def request_info(environ: Environ) -> RequestInfo:
    headers = {
        name[5:].replace("_", "-").lower(): str(value)
        for name, value in environ.items()
        if name.startswith("HTTP_")
    }
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = str(environ[name])
    path = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/"
    return RequestInfo(
        method=str(environ.get("REQUEST_METHOD", "GET")),
        path=path,
        headers=headers,
        client=environ.get("REMOTE_ADDR") or None,
        user=environ.get("REMOTE_USER") or None,
        raw=environ,
    )


def context_of(environ: Environ) -> RequestMetering:
    context = environ.get(ENVIRON_KEY)
    if not isinstance(context, RequestMetering):
        context = environ[ENVIRON_KEY] = RequestMetering()
    return context


class WSGIMeteringMiddleware(Middleware[WSGIApp]):
    """The WSGI twin of `metering.middleware.MeteringMiddleware`; same options."""

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        context = context_of(environ)
        step = self.policy.enter(request_info(environ), context)
        if step.response is not None:
            response = step.response
            status = f"{response.status} {REASONS.get(response.status, 'Error')}"
            start_response(status, list(response.headers))
            return [response.body]
        if step.applied is None:
            return self.app(environ, start_response)

        def start_with_headers(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            extra = self.policy.response_headers(step, context)
            return start_response(status, [*headers, *extra], exc_info)

        try:
            return self.app(environ, start_with_headers)
        finally:
            # Every limit further in decided before the application ran, so
            # this reservation's fate is known once the application returns.
            self.policy.leave(step)
