"""Usage limits at the edge of each HTTP request, for ASGI and WSGI applications."""

from metering.middleware.asgi import MeteringMiddleware
from metering.middleware.core import DeniedResponse, RequestMetering
from metering.middleware.keys import (
    RequestInfo,
    authenticated_user,
    client_ip,
    header,
    subject_of,
)
from metering.middleware.routes import Route
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
    "subject_of",
]
