"""Debian's headless Chromium for the browser tests, driven by Selenium.

``chromium`` and ``chromium-driver`` (``scripts/ensure-servers.sh``, run by
``make test``, installs them when missing), through ``/usr/bin/chromedriver``:
Selenium never downloads a browser or a driver. Without them a test skips,
except under CI, where it fails. Screenshots go to `ARTIFACTS` (ignored by git).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PHONE = (390, 844)
DESKTOP = (1280, 900)


def chromium(size: tuple[int, int] = PHONE) -> Any:
    """A headless Chromium with a window of ``size``, logging the console and the network."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        reason = (
            f"{', '.join(missing)} missing: scripts/ensure-servers.sh (make servers) installs "
            "Debian's chromium and chromium-driver, as root"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the browser test", pytrace=False)
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={size[0]},{size[1]}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser sent a request to since the last call (its network
    log), less those it blocked itself (a Content-Security-Policy refusal)."""
    urls: dict[str, str] = {}
    blocked = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message["params"]
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason"):
            blocked.add(params["requestId"])
    return [url for request, url in urls.items() if request not in blocked]


def console_errors(driver: Any) -> list[Any]:
    """The browser console's warnings and errors since the last call."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def screenshot(driver: Any, name: str) -> Path:
    """Save the window as ``ARTIFACTS/name.png``, print and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    return shot
