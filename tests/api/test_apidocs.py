"""``/docs`` and ``/redoc`` work offline, and the schema declares its bearer scheme.

The pages' HTML names no other host and every file it loads is answered by
the app itself; in a real Chromium both pages render from those files alone
(every request the browser makes goes to the app; the pages' policy refuses
ReDoc's vendor logo), Swagger UI with its Authorize button. ``/openapi.json``
declares the bearer scheme, and every operation names it with the scope its
route asks (`require_scope`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from metering.api import create_api
from metering.api.auth import BEARER
from metering.settings import Settings
from tests.api.browser import chromium, console_errors, requested_urls, screenshot

# src="..." and href="..." in a page, and url: '...' in Swagger UI's script.
LOADED = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.fixture
def http(in_process: Any, embedded: dict[str, str]) -> httpx.Client:
    client: httpx.Client = in_process(create_api(Settings(**embedded)))
    return client


def _loaded(page: str) -> list[str]:
    return [a or b for a, b in LOADED.findall(page)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_loads_its_files_from_the_app(http: httpx.Client, page: str) -> None:
    answer = http.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?:|//[a-z]", answer.text, re.IGNORECASE)
    loaded = _loaded(answer.text)
    assert any(u.endswith(".js") for u in loaded)
    for url in loaded:
        assert url.startswith("/") and not url.startswith("//"), url
        file = http.get(url)
        assert file.status_code == 200, url
        assert len(file.content) > 0, url


def test_every_operation_names_the_bearer_scheme_and_its_scope(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    scheme = schema["components"]["securitySchemes"][BEARER]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    for scope in ("ingest", "read", "admin"):
        assert f"`{scope}`" in scheme["description"]
    paths = schema["paths"]
    found = {
        f"{method.upper()} {path}": operation["security"]
        for path, operations in paths.items()
        for method, operation in operations.items()
    }
    assert found["POST /v1/events"] == [{BEARER: ["ingest"]}]
    assert found["GET /v1/subjects/{subject}/usage"] == [{BEARER: ["read"]}]
    assert found["PUT /v1/limits/{name}"] == [{BEARER: ["admin"]}]
    # The usage page opens with a customer's key, or with no key and a signed link.
    assert found["GET /portal"] == [{BEARER: ["read"]}, {}]
    for operation, security in found.items():
        assert security and all(set(r) <= {BEARER} for r in security), operation


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_renders_offline_in_chromium(
    page: str, serve_api: Any, embedded: dict[str, str], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    base = serve_api(create_api(Settings(**embedded)))
    browser = chromium((1280, 900))
    try:
        browser.get(base + page)
        if page == "/docs":
            ready = (By.CSS_SELECTOR, "button.authorize")
        else:
            ready = (By.CSS_SELECTOR, "[data-section-id^='tag/']")
        WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located(ready))
        shot = screenshot(browser, f"api{page.replace('/', '-')}")
        host = urlsplit(base).netloc
        elsewhere = [u for u in requested_urls(browser) if urlsplit(u).netloc not in (host, "")]
        assert elsewhere == []
        # ReDoc's menu asks for its vendor's logo: the page's policy refuses it.
        refused = [e for e in console_errors(browser) if "Content Security Policy" in e["message"]]
        assert [e for e in console_errors(browser) if e not in refused] == []
        assert all("cdn.redoc.ly" in e["message"] for e in refused)
        assert shot.stat().st_size > 0
    finally:
        browser.quit()
