"""``GET /portal``, the usage page, and its signed links (``metering portal link``).

The page in a real browser is tests/api/test_portal_browser.py; here its
HTTP answers: a customer's key or a link opens the subject's page, nothing
else opens any page, and the link holds no API key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from click.testing import CliRunner

from metering import FrozenClock, Limit, Meter
from metering.apikeys import ApiKeys
from metering.cli import main

NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limit(Limit("tokens", maximum=1000, period="1d", window="calendar"))
        m.consume("org-1", "tokens", 420, event_id="e-1")
        m.consume("org-2", "tokens", 777, event_id="e-2")
        m.grant("org-1", "tokens", 250, grant_id="g-1")
        yield m


def _token(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def test_a_customer_key_opens_its_own_page(http: httpx.Client, meter: Meter) -> None:
    _, token = ApiKeys(meter).create("read", subject="org-1")
    page = http.get("/portal", headers={"Authorization": f"Bearer {token}"})
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    text = page.text
    assert '<meta name="viewport"' in text
    assert 'data-used="420" data-maximum="1000"' in text
    assert 'class="grants">250<' in text
    assert "<svg" in text and "<script" not in text
    assert "org-2" not in text and "777" not in text


def test_a_signed_link_opens_the_page_until_it_expires(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    link = meter.portal_link("org-1", 3600, base_url="https://usage.example.com")
    assert link.startswith("https://usage.example.com/portal?token=")
    token = _token(link)
    assert "mk_" not in link
    assert http.get("/portal", params={"token": token}).status_code == 200
    clock.set(NOW + timedelta(seconds=3599))
    assert http.get("/portal", params={"token": token}).status_code == 200
    clock.set(NOW + timedelta(seconds=3600))
    expired = http.get("/portal", params={"token": token})
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]
    # A browser gets a page saying so, with the same status and challenge.
    page = http.get("/portal", params={"token": token}, headers={"Accept": "text/html"})
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert page.headers["www-authenticate"].startswith("Bearer")
    assert "has expired: ask for a new one" in page.text and "org-1" not in page.text


def test_nothing_else_opens_a_page(http: httpx.Client, meter: Meter) -> None:
    token = _token(meter.portal_link("org-1", 60))
    forged = token.replace(token.split(".")[1], "b3JnLTI")  # org-2, base64url
    _, admin = ApiKeys(meter).create("admin")
    _, reader = ApiKeys(meter).create("read")
    for params, headers in (
        ({"token": forged}, {}),
        ({"token": "v1.x.1.y"}, {}),
        ({"token": "v1.\u00e9.1795875293.x"}, {}),  # any bytes: a 401, never a 500
        ({"token": "v1.b3JnLTE.\u0661\u0667\u0669\u0665.x"}, {}),  # Arabic-Indic digits
        ({"token": token.replace(".", ".\u00b2", 1)}, {}),
        ({}, {}),
        ({}, {"Authorization": f"Bearer {admin}"}),  # an operator's key names no subject
        ({}, {"Authorization": f"Bearer {reader}"}),
        ({}, {"Authorization": "Bearer mk_000000000000_" + "x" * 43}),
    ):
        answer = http.get("/portal", params=params, headers=headers)
        assert answer.status_code == 401, (params, headers, answer.text)
        assert "org-" not in answer.text


def test_a_link_is_no_key_for_the_api(http: httpx.Client, meter: Meter) -> None:
    ApiKeys(meter).create("admin")  # keys are required from now on
    token = _token(meter.portal_link("org-1", 60))
    answer = http.get("/v1/subjects/org-1/usage", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401


def test_cli_prints_a_link(meter: Meter, http: httpx.Client) -> None:
    runner = CliRunner()
    made = runner.invoke(main, ["--database", meter.url, "portal", "link", "org-1", "--ttl", "30m"])
    assert made.exit_code == 0, made.output
    link = made.stdout.strip()
    assert link.startswith("http://127.0.0.1:8000/portal?token=")
    assert http.get("/portal", params={"token": _token(link)}).status_code == 200
    bad = runner.invoke(main, ["--database", meter.url, "portal", "link", "org-1", "--ttl", "1y"])
    assert bad.exit_code != 0 and bad.output.startswith("error:")
    assert "Traceback" not in bad.output


def test_links_are_made_under_the_public_url(
    meter: Meter, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METERING_PUBLIC_URL", "https://usage.example.com/metering/")
    runner = CliRunner()
    made = runner.invoke(main, ["--database", meter.url, "portal", "link", "org-1"])
    assert made.exit_code == 0, made.output
    link = made.stdout.strip()
    assert link.startswith("https://usage.example.com/metering/portal?token=")
    assert http.get("/portal", params={"token": _token(link)}).status_code == 200
    assert meter.portal_link("org-1").startswith("https://usage.example.com/metering/portal?")
    given = meter.portal_link("org-1", base_url="http://10.0.0.7:8000")
    assert given.startswith("http://10.0.0.7:8000/portal?token=")  # the argument first
    for bad in ("https://usage.example.com/?from=mail", "usage.example.com"):
        refused = runner.invoke(
            main, ["--database", meter.url, "portal", "link", "org-1", "--base-url", bad]
        )
        assert refused.exit_code == 1 and refused.output.startswith("error: base_url: ")
    monkeypatch.setenv("METERING_PUBLIC_URL", "ftp://usage.example.com")
    refused = runner.invoke(main, ["--database", meter.url, "portal", "link", "org-1"])
    assert refused.exit_code == 1, refused.output
    assert refused.output.startswith("error: METERING_PUBLIC_URL='ftp://usage.example.com'")


def test_the_usage_route_counts_grants_left_as_the_page_does(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(Limit("exports", maximum=10, period="1mo", window="calendar"))
    meter.grant("org-1", "exports", 40, grant_id="g-2")
    later = NOW + timedelta(days=2)
    meter.grant("org-1", "tokens", 99, grant_id="g-later", effective_from=later)
    meter.consume("org-1", "tokens", 750, event_id="e-3")  # 170 past the maximum: g-1 pays
    _, token = ApiKeys(meter).create("read", subject="org-1")
    answer = http.get("/v1/subjects/org-1/usage", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    left = {u["limit"]: u["grants_left"] for u in answer.json()["limits"]}
    assert left == {"exports": 40, "tokens": 80}  # g-later is not in force yet
    page = http.get("/portal", headers={"Authorization": f"Bearer {token}"}).text
    assert 'class="grants">80<' in page and 'class="grants">40<' in page
    other = http.get("/v1/subjects/org-2/usage", headers={"Authorization": f"Bearer {token}"})
    assert other.status_code == 404


def test_a_rotated_secret_keeps_old_links_until_the_grace_ends(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    week = 7 * 86400
    old = _token(meter.portal_link("org-1", week))
    until = meter.rotate_portal_secret(grace_seconds=3600)
    assert until == NOW + timedelta(hours=1)
    new = _token(meter.portal_link("org-1", week))
    assert new.rsplit(".", 1)[1] != old.rsplit(".", 1)[1]  # same payload, a new signature

    def status(token: str) -> int:
        return http.get("/portal", params={"token": token}).status_code

    assert (status(old), status(new)) == (200, 200)
    clock.set(until - timedelta(seconds=1))
    assert (status(old), status(new)) == (200, 200)
    clock.set(until)
    assert (status(old), status(new)) == (401, 200)
    # No grace: the links of the secret just replaced stop at once, and older ones stay dead.
    meter.rotate_portal_secret(grace_seconds=0)
    newest = _token(meter.portal_link("org-1", week))
    assert (status(old), status(new), status(newest)) == (401, 401, 200)


def test_cli_rotates_the_link_secret(meter: Meter, http: httpx.Client) -> None:
    runner = CliRunner()
    link = meter.portal_link("org-1", 86400)
    rotated = runner.invoke(main, ["--database", meter.url, "portal", "rotate", "--grace", "30m"])
    assert rotated.exit_code == 0, rotated.output
    # The command's own clock is the system's: the time shown is 30 minutes on.
    assert re.fullmatch(
        r"rotated: links made before now work until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n",
        rotated.output,
    ), rotated.output
    assert http.get("/portal", params={"token": _token(link)}).status_code == 200
    for bad in ("32d", "-1m", "soon"):
        refused = runner.invoke(main, ["--database", meter.url, "portal", "rotate", "--grace", bad])
        assert refused.exit_code != 0, refused.output
        assert refused.output.startswith("error:") and "grace" in refused.output, refused.output
        assert "Traceback" not in refused.output


def test_a_zoned_subjects_page_and_history_show_local_labels(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    clock.set(datetime(2026, 3, 1, tzinfo=UTC))
    meter.set_time_zone("org-de", "Europe/Berlin")
    # Berlin's 29 March lasts 23 hours: 28 March 23:00 UTC to 29 March 22:00 UTC.
    clock.set(datetime(2026, 3, 29, 12, tzinfo=UTC))
    meter.consume("org-de", "tokens", 5)
    _, token = ApiKeys(meter).create("read", subject="org-de")
    headers = {"Authorization": f"Bearer {token}"}
    page = http.get("/portal", headers=headers).text
    assert 'data-time-zone="Europe/Berlin">this window: 2026-03-29 Europe/Berlin<' in page
    answer = http.get("/v1/subjects/org-de/usage/history?limit=tokens&bucket=day", headers=headers)
    assert answer.status_code == 200
    last = answer.json()["points"][-1]
    assert (last["start"], last["time_zone"]) == ("2026-03-29T00:00:00+00:00", "Europe/Berlin")
    assert last["local_window"] == (
        "2026-03-29 01:00:00+01:00 to 2026-03-30 02:00:00+02:00 Europe/Berlin"
    )
    history = meter.usage_history("org-1", "tokens")
    assert {p.get("time_zone") for p in history.to_dict()["points"]} == {None}
    schema = http.get("/openapi.json").json()["components"]["schemas"]
    assert "local_window" in schema["HistoryPoint"]["properties"]
    assert "local_window" in schema["SpendRowOut"]["properties"]
