"""The product's own limits (``metering.*``) are reserved (issue 19, item 6).

An admin ``DELETE /v1/limits/metering.api.requests`` used to make every later
request answer 503 (the per-key rate limit was gone). Now the API answers 409
(problem+json), the CLI one ``error:`` line, and `Meter.set_limit` /
`delete_limit` / `load_limits` raise `ReservedLimit`; only the product's own
path (`Meter.set_product_limit`, what the API's startup uses) writes them.
Listings hide them unless asked (``?all=true``, ``--all``). Entitlements,
grants and ``reset`` of one are refused the same way (issue 30, item 11).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from loopback import http_client

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.api.ratelimit import RATE_LIMIT
from metering.apikeys import ApiKeys
from metering.cli import main
from metering.errors import ReservedLimit
from metering.settings import ApiRate, Settings

Serve = Callable[[Any], str]
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"


@pytest.fixture
def meter(db_url: str) -> Iterator[Meter]:
    with Meter(db_url, clock=FrozenClock(NOW)) as m:
        m.set_limit(Limit("api_calls", maximum=1000, period="1h"))
        yield m


@pytest.fixture
def admin(serve_api: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    settings = Settings(
        meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", api_rate=ApiRate(6000, "1m")
    )
    _key, token = ApiKeys(meter).create("admin", name="ops")
    base = serve_api(create_api(settings, meter=meter))
    with http_client(base_url=base, headers={"authorization": f"Bearer {token}"}) as client:
        yield client


def test_the_api_refuses_to_change_or_delete_a_reserved_limit(
    admin: httpx.Client, meter: Meter
) -> None:
    before = meter.get_limit(RATE_LIMIT)  # the startup wrote it
    deleted = admin.delete(f"/v1/limits/{RATE_LIMIT}")
    assert deleted.status_code == 409, deleted.text
    assert deleted.headers["content-type"] == PROBLEM
    assert deleted.json()["type"] == "urn:metering:problem:reserved-limit"
    assert RATE_LIMIT in deleted.json()["detail"]
    replaced = admin.put(f"/v1/limits/{RATE_LIMIT}", json={"maximum": 1, "period": "1h"})
    assert replaced.status_code == 409, replaced.text
    created = admin.put("/v1/limits/metering.mine", json={"maximum": 1, "period": "1h"})
    assert created.status_code == 409, created.text
    # Nothing changed, and the API still answers.
    assert meter.get_limit(RATE_LIMIT) == before
    assert admin.get("/v1/limits").status_code == 200
    assert admin.get(f"/v1/limits/{RATE_LIMIT}").json()["name"] == RATE_LIMIT


def test_listings_hide_reserved_limits_unless_asked(admin: httpx.Client) -> None:
    names = [limit["name"] for limit in admin.get("/v1/limits").json()["limits"]]
    assert names == ["api_calls"]
    everything = admin.get("/v1/limits", params={"all": "true"}).json()["limits"]
    assert sorted(limit["name"] for limit in everything) == ["api_calls", RATE_LIMIT]


def test_the_library_refuses_reserved_names_but_the_product_path(meter: Meter) -> None:
    own = Limit("metering.api.requests", maximum=10, period="1m", algorithm="token_bucket")
    with pytest.raises(ReservedLimit) as raised:
        meter.set_limit(own)
    assert raised.value.limit == "metering.api.requests"
    with pytest.raises(ReservedLimit):
        meter.set_limits([Limit("ok", maximum=1, period="1h"), own])
    assert [limit.name for limit in meter.list_limits()] == ["api_calls"]  # none of them
    meter.set_product_limit(own)
    with pytest.raises(ReservedLimit):
        meter.delete_limit("metering.api.requests")
    assert meter.get_limit("metering.api.requests") == own
    with pytest.raises(ReservedLimit):
        meter.set_product_limit(Limit("not_ours", maximum=1, period="1h"))


def test_the_cli_refuses_reserved_names_with_one_error_line(
    tmp_path: Path, sqlite_url: str
) -> None:
    url = sqlite_url
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(main, ["--database", url, *args])

    with Meter(url) as meter:
        meter.set_product_limit(Limit(RATE_LIMIT, maximum=5, period="1m", algorithm="token_bucket"))
    assert run("limits", "set", "api_calls", "--max", "5", "--period", "1h").exit_code == 0
    for args in (
        ("limits", "set", "metering.x", "--max", "5", "--period", "1h"),
        ("limits", "delete", RATE_LIMIT),
    ):
        result = run(*args)
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert "reserved" in lines[0]
    listed = run("limits", "list", "--format", "json")
    assert [limit["name"] for limit in _json(listed.output)] == ["api_calls"]
    everything = run("limits", "list", "--all", "--format", "json")
    assert sorted(limit["name"] for limit in _json(everything.output)) == ["api_calls", RATE_LIMIT]
    file = tmp_path / "limits.yaml"
    file.write_text("metering.y:\n  maximum: 1\n  period: 1h\n")
    loaded = run("limits", "load", str(file))
    assert loaded.exit_code == 1 and loaded.output.startswith("error: "), loaded.output


def _json(text: str) -> Any:
    return json.loads(text)


def test_allowances_and_reset_refuse_reserved_limits(meter: Meter) -> None:
    own = Limit(RATE_LIMIT, maximum=10, period="1m", algorithm="token_bucket")
    meter.set_product_limit(own)
    refused: list[Callable[[], object]] = [
        lambda: meter.set_entitlement("apikey:k1", RATE_LIMIT, 1_000_000),
        lambda: meter.delete_entitlement("apikey:k1", RATE_LIMIT),
        lambda: meter.grant("apikey:k1", RATE_LIMIT, 5),
        lambda: meter.grant("apikey:k1", "metering.mine", 5, every="1mo"),
        lambda: meter.reset(limit=RATE_LIMIT),
        lambda: meter.reset(subject="apikey:k1", limit="metering.mine"),
    ]
    for call in refused:
        with pytest.raises(ReservedLimit) as raised:
            call()
        assert raised.value.limit.startswith("metering.")
    assert meter.entitlements() == [] and meter.grants() == []


def test_the_api_refuses_allowances_of_reserved_limits(admin: httpx.Client, meter: Meter) -> None:
    answers = [
        admin.put(f"/v1/entitlements/apikey:k1/{RATE_LIMIT}", json={"maximum": 10**6}),
        admin.delete(f"/v1/entitlements/apikey:k1/{RATE_LIMIT}"),
        admin.post("/v1/grants", json={"subject": "apikey:k1", "limit": RATE_LIMIT, "amount": 5}),
    ]
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert answer.headers["content-type"] == PROBLEM
        assert answer.json()["type"] == "urn:metering:problem:reserved-limit"
        assert RATE_LIMIT in answer.json()["detail"]
    assert meter.entitlements() == [] and meter.grants() == []


def test_the_cli_refuses_allowances_and_reset_of_reserved_limits(
    tmp_path: Path, sqlite_url: str
) -> None:
    url = sqlite_url
    runner = CliRunner()
    with Meter(url) as meter:
        meter.set_product_limit(Limit(RATE_LIMIT, maximum=5, period="1m", algorithm="token_bucket"))
    file = tmp_path / "entitlements.yaml"
    file.write_text(f"- subject: apikey:k1\n  limit: {RATE_LIMIT}\n  maximum: 9\n")
    for args in (
        ("entitlements", "set", "apikey:k1", RATE_LIMIT, "1000"),
        ("entitlements", "delete", "apikey:k1", RATE_LIMIT),
        ("entitlements", "load", str(file)),
        ("grants", "add", "apikey:k1", RATE_LIMIT, "5"),
        ("reset", "--limit", RATE_LIMIT),
    ):
        result = runner.invoke(main, ["--database", url, *args])
        assert result.exit_code == 1, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert "reserved" in lines[0], result.output
    with Meter(url) as meter:
        assert meter.entitlements() == [] and meter.grants() == []
