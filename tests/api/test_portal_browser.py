"""The usage page in a real headless Chromium, against a real uvicorn server.

Debian's ``chromium`` driven by Selenium (`tests.api.browser`). The page
opened from a signed link, at a phone's and a desktop's width: it shows
org-1's numbers and nothing of org-2's, says in words what they mean
(within the limit, over and billed as overage, blocked until a time), shows
grants only where org-1 has some, draws each chart with dates and values
(per day; per window for a calendar month without rollups, never the month
in one bar on the 1st; per day from the hourly rollups for one with
dimensions), fits the width, and logs no console error. A forged link gets
an HTML page, not JSON. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.settings import Settings
from tests.api.browser import DESKTOP, PHONE, chromium, console_errors, screenshot

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def meter(sqlite_url: str) -> Iterator[Meter]:
    clock = FrozenClock(NOW - timedelta(days=29))
    with Meter(sqlite_url, clock=clock) as m:
        m.set_limit(Limit("tokens", maximum=1000, period="1d", window="calendar"))
        m.set_limit(Limit("api_calls", maximum=50, period="1h", dimensions=("route",)))
        m.set_limit(
            Limit("messages", maximum=100, period="1mo", window="calendar", enforcement="soft")
        )
        m.set_limit(
            Limit("storage", maximum=5000, period="1mo", window="calendar", dimensions=("region",))
        )
        for day in range(30):
            clock.set(NOW - timedelta(days=29 - day))
            m.consume("org-1", "tokens", 100 + 10 * day, event_id=f"t1-{day}")
            m.consume("org-2", "tokens", 987, event_id=f"t2-{day}")
            m.consume("org-1", "storage", 10 + day, event_id=f"s1-{day}", metadata={"region": "eu"})
        for n in range(5):  # this month: 125 messages of 100, soft: overage
            m.consume("org-1", "messages", 25, event_id=f"m1-{n}")
        m.consume("org-1", "api_calls", 50, event_id="a1", metadata={"route": "/chat"})
        m.consume("org-1", "api_calls", 9, event_id="a1-denied")  # 50 + 9 > 50: denied
        m.consume("org-2", "api_calls", 31, event_id="a2", metadata={"route": "/x"})
        m.grant("org-1", "tokens", 250, grant_id="g-1")
        m.grant("org-2", "tokens", 6543, grant_id="g-2")
        yield m


@pytest.fixture
def base(meter: Meter, serve_api: Any, tmp_path: Path) -> str:
    settings = Settings(
        database_url=meter.url, broker_url=f"sqla+sqlite:///{tmp_path}/metering-broker.db"
    )
    ApiKeys(meter).create("admin")  # keys required: the page opens by its link alone
    url: str = serve_api(create_api(settings, meter=meter))
    return url


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_usage_page_in_chromium(meter: Meter, base: str, size: tuple[int, int]) -> None:
    from selenium.webdriver.common.by import By

    link = meter.portal_link("org-1", 3600, base_url=base)
    browser = chromium(size)
    try:
        browser.get(link)
        shot = screenshot(browser, f"portal-org-1-{size[0]}px")

        assert browser.title == "Usage of org-1"
        assert browser.find_element(By.ID, "subject").text == "org-1"
        panels = {
            p.get_attribute("data-limit"): p
            for p in browser.find_elements(By.CSS_SELECTOR, ".limit")
        }
        assert set(panels) == {"api_calls", "messages", "storage", "tokens"}

        def text(limit: str, css: str) -> str:
            found: str = panels[limit].find_element(By.CSS_SELECTOR, css).text
            return found

        tokens = panels["tokens"]
        assert text("tokens", ".figures") == "390 of 1,000"
        assert text("tokens", ".standing") == "within the limit: 610 left"
        assert "resets 2026-11-23 00:00:00 UTC" in tokens.text
        # Grants where org-1 has some, and nowhere else.
        assert text("tokens", ".grants") == "250"
        for other in ("api_calls", "messages", "storage"):
            assert "grants" not in panels[other].text, other
        assert text("messages", ".figures") == "125 of 100"
        assert text("messages", ".standing") == "over by 25: billed as overage"
        assert text("api_calls", ".figures") == "50 of 50"
        assert (
            text("api_calls", ".standing") == "limit reached: blocked until 2026-11-22 10:30:00 UTC"
        )

        # Per day, with dates and values: 30 bars, growing, the axis from 0 to the top.
        bars = tokens.find_elements(By.CSS_SELECTOR, "svg rect")
        assert len(bars) == 30
        assert float(bars[-1].get_attribute("height")) > float(bars[0].get_attribute("height")) > 0
        assert [b.get_attribute("data-start") for b in (bars[0], bars[-1])] == [
            "2026-10-24",
            "2026-11-22",
        ]
        dates = [t.text for t in tokens.find_elements(By.CSS_SELECTOR, "svg text.date")]
        assert dates[0] == "Oct 24" and dates[-1] == "Nov 22"
        assert tokens.find_element(By.CSS_SELECTOR, "svg text.top").text == "1k"
        # A calendar month with rollups: per day, so the 1st holds its own day only.
        days = {
            b.get_attribute("data-start"): int(b.get_attribute("data-used"))
            for b in panels["storage"].find_elements(By.CSS_SELECTOR, "svg rect")
        }
        assert len(days) == 30 and days["2026-11-01"] == 10 + 8 and days["2026-11-22"] == 39
        # A calendar month without them: one bar per month, said so, dated.
        months = panels["messages"].find_elements(By.CSS_SELECTOR, "svg rect")
        assert [m.get_attribute("data-start") for m in months] == ["2026-11-01"]
        assert "used per window" in panels["messages"].text
        assert "per day" not in panels["messages"].text

        denials = browser.find_element(By.ID, "denials").text
        assert "api_calls" in denials and "9" in denials
        page = browser.page_source
        for other in ("org-2", "987", "6,543", "31 of"):
            assert other not in page, other
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= browser.execute_script("return window.innerWidth")  # fits
        assert console_errors(browser) == []
        assert shot.stat().st_size > 0
    finally:
        browser.quit()


def test_a_forged_link_gets_a_page_not_json(meter: Meter, base: str) -> None:
    from selenium.webdriver.common.by import By

    link = meter.portal_link("org-1", 3600, base_url=base)
    browser = chromium(PHONE)
    try:
        browser.get(link[:-3] + "AAA")
        screenshot(browser, "portal-refused")
        assert browser.title == "Usage page unavailable"
        detail = browser.find_element(By.ID, "detail").text
        assert detail == "the link is not valid or has expired: ask for a new one"
        assert browser.find_element(By.ID, "refused").text.startswith("This link does not open")
        # Chromium shows a JSON answer as text in a <pre>: not here.
        assert browser.find_elements(By.TAG_NAME, "pre") == []
        assert "org-1" not in browser.page_source
    finally:
        browser.quit()
