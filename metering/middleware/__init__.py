"""Usage limits at the edge of each HTTP request, for ASGI and WSGI applications."""

from metering.middleware.asgi import MeteringMiddleware
from metering.middleware.core import (
    DeniedResponse,
    RequestInfo,
    RequestMetering,
    Route,
    authenticated_user,
    client_ip,
    header,
)
from metering.middleware.wsgi import WSGIMeteringMiddleware

__all__ = [
    "DeniedResponse",
    "MeteringMiddleware",
    "RequestInfo",
    "RequestMetering",
    "Route",
    "WSGIMeteringMiddleware",
    "authenticated_user",
    "client_ip",
    "header",
]
