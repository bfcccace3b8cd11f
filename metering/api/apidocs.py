"""``GET /docs`` (Swagger UI) and ``GET /redoc``, served from the app alone.

Their scripts, styles and icon are files of the installed ``fastapi-offline``
package, served under `ASSETS`; nothing comes from another host, and each
page's Content-Security-Policy holds the browser to that (ReDoc's menu shows
a logo from its vendor's CDN: it is not fetched). The pages ask no key: the
schema they read (``/openapi.json``) is public, and Swagger UI's Authorize
button sends the key a user gives it.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

ASSETS: Final = "/docs-assets"
# Swagger UI runs one inline script and ReDoc inline styles; ReDoc's search
# runs in a worker made from a blob.
HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-inline'; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:"
    ),
    "X-Content-Type-Options": "nosniff",
}
# Swagger UI keeps the key given to Authorize across reloads, and asks no
# online validator for a badge.
SWAGGER_UI: Final = {"persistAuthorization": True, "validatorUrl": None}


def install_docs(app: FastAPI, *, docs: str = "/docs", redoc: str = "/redoc") -> None:
    """Serve ``docs`` and ``redoc`` on ``app`` (created with neither)."""
    static = files("fastapi_offline") / "static"
    app.mount(ASSETS, StaticFiles(directory=str(static)), name="docs-assets")
    schema = app.openapi_url or "/openapi.json"

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=root + schema,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI,
        )
        return HTMLResponse(page.body, headers=HEADERS)

    async def redoc_page(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=root + schema,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        return HTMLResponse(page.body, headers=HEADERS)

    app.add_api_route(docs, swagger_ui, include_in_schema=False)
    app.add_api_route(redoc, redoc_page, include_in_schema=False)
