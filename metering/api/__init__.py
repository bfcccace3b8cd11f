"""The HTTP API (``metering serve``): `create_api` builds it; docs/api-http.md."""

from metering.api.app import create_api

__all__ = ["create_api"]
