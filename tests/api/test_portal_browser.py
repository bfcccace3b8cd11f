"""The usage page in a real headless Chromium, against a real uvicorn server.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/ensure-servers.sh``,
run by ``make test``, installs them when missing), driven by Selenium through
``/usr/bin/chromedriver``: Selenium never downloads a browser or a driver.
The page opened from a signed link, on a phone-sized window: it loads, shows
org-1's numbers (used, maximum, grants left, 30 days of bars, its denials)
and nothing of org-2's, fits the width, and the browser logged no console
error. The screenshot is kept under ``test-artifacts/`` (ignored by git);
its path is printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


def _chromium() -> Any:
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
        "--window-size=390,844",  # a phone
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def meter(tmp_path: Path) -> Iterator[Meter]:
    clock = FrozenClock(NOW - timedelta(days=29))
    with Meter(f"sqlite:///{tmp_path}/metering.db", clock=clock) as m:
        m.set_limit(Limit("tokens", maximum=1000, period="1d", window="calendar"))
        m.set_limit(Limit("api_calls", maximum=50, period="1h", dimensions=("route",)))
        for day in range(30):
            clock.set(NOW - timedelta(days=29 - day))
            m.consume("org-1", "tokens", 100 + 10 * day, event_id=f"t1-{day}")
            m.consume("org-2", "tokens", 987, event_id=f"t2-{day}")
        m.consume("org-1", "api_calls", 42, event_id="a1", metadata={"route": "/chat"})
        m.consume("org-1", "api_calls", 9, event_id="a1-denied")  # 42 + 9 > 50: denied
        m.consume("org-2", "api_calls", 31, event_id="a2", metadata={"route": "/x"})
        m.grant("org-1", "tokens", 250, grant_id="g-1")
        m.grant("org-2", "tokens", 6543, grant_id="g-2")
        yield m


def test_the_usage_page_in_chromium(
    browser: Any, meter: Meter, serve_api: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    settings = Settings(
        database_url=meter.url, broker_url=f"sqla+sqlite:///{tmp_path}/metering-broker.db"
    )
    ApiKeys(meter).create("admin")  # keys required: the page opens by its link alone
    base = serve_api(create_api(settings, meter=meter))
    link = meter.portal_link("org-1", 3600, base_url=base)

    browser.get(link)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "portal-org-1.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")

    assert browser.title == "Usage of org-1"
    assert browser.find_element(By.ID, "subject").text == "org-1"
    panels = {
        p.get_attribute("data-limit"): p for p in browser.find_elements(By.CSS_SELECTOR, ".limit")
    }
    assert set(panels) == {"api_calls", "tokens"}
    tokens = panels["tokens"]
    assert tokens.find_element(By.CLASS_NAME, "figures").text == "390 of 1,000"
    assert tokens.find_element(By.CLASS_NAME, "grants").text == "250"
    assert "resets 2026-11-23 00:00 UTC" in tokens.text
    bars = tokens.find_elements(By.CSS_SELECTOR, "svg rect")
    assert len(bars) == 30
    assert float(bars[-1].get_attribute("height")) > float(bars[0].get_attribute("height")) > 0
    assert panels["api_calls"].find_element(By.CLASS_NAME, "figures").text == "42 of 50"
    denials = browser.find_element(By.ID, "denials").text
    assert "api_calls" in denials and "9" in denials

    page = browser.page_source
    for other in ("org-2", "987", "6,543", "31 of"):
        assert other not in page, other
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= browser.execute_script("return window.innerWidth")  # fits a phone
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    assert shot.stat().st_size > 0
