"""The admin routes over HTTP: limits, reports, webhook endpoints (reservations:
`test_api_reservations.py`).

The API runs under uvicorn on a loopback port (one server for the module,
each test's app mounted on it: `serve_api_shared`) and is driven with
httpx; every test runs on PostgreSQL and on the embedded SQLite default
(`db_url`), and one test lets the app open the embedded default itself, as
``metering serve`` does with no configuration. Each route's success and
error answers are checked whole (problem+json, the field at fault named);
after bad input the library (or the tables) shows that nothing was stored.
A report streams: the client holds its first bytes while the database
cursor is still open, and a client that leaves midway closes it. Last, a
schemathesis pass over the admin operations (valid and invalid input, every
body and query) and a check that every error status is in the schema.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import hypothesis.errors
import pytest
import schemathesis
from budgets import cases
from hypothesis import HealthCheck, given, settings
from loopback import http_client
from pytest_httpserver import HTTPServer
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from metering import FrozenClock, Limit, Meter
from metering.api import create_api
from metering.apikeys import ApiKeys
from metering.domain.events import make_event
from metering.errors import UnknownLimit
from metering.reports import (
    COLUMNS,
    Report,
    overage_report,
    shadow_report,
    usage_report,
    write_csv,
)
from metering.settings import DeliverySettings, Settings
from metering.webhooks.endpoints import Webhooks
from metering.webhooks.signing import verify

Serve = Callable[[Any], str]  # the serve_api_shared fixture
NOW = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
PROBLEM = "application/problem+json"
LIMITS = (
    Limit("api_calls", maximum=5, period="1h", window="calendar"),
    Limit("seats", maximum=3, period="1mo", window="calendar"),
)
ADMIN_PREFIXES = ("/v1/reservations", "/v1/limits", "/v1/reports", "/v1/webhooks")
LOOPBACK = DeliverySettings(timeout_seconds=5, allow_private=True)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def meter(db_url: str, clock: FrozenClock) -> Iterator[Meter]:
    with Meter(db_url, clock=clock) as m:
        m.set_limits(LIMITS)
        yield m


def serve(
    serve_api_shared: Serve, meter: Meter, tmp_path: Path, delivery: DeliverySettings = LOOPBACK
) -> httpx.Client:
    settings = Settings(meter.url, f"sqla+sqlite:///{tmp_path}/broker.db", delivery=delivery)
    return http_client(base_url=serve_api_shared(create_api(settings, meter=meter)), timeout=30)


@pytest.fixture
def http(serve_api_shared: Serve, meter: Meter, tmp_path: Path) -> Iterator[httpx.Client]:
    with serve(serve_api_shared, meter, tmp_path) as client:
        yield client


def problem(
    answer: httpx.Response, status: int, slug: str, field: str | None = None, case: str = ""
) -> Any:
    """The problem body, after checking its status, media type, type and field
    (``case`` names the case in a failure)."""
    where = f"{case}: {answer.text}"
    assert answer.status_code == status, where
    assert answer.headers["content-type"] == PROBLEM, where
    body = answer.json()
    assert body["type"] == f"urn:metering:problem:{slug}", where
    assert body["status"] == status, where
    assert body["title"] and body["detail"], where
    if field is not None:
        assert [e["field"] for e in body["errors"]] == [field], where
    return body


def used(meter: Meter, subject: str, limit: str) -> int:
    return sum(c.used for c in meter.counters(subject, limit))


# -- limits ------------------------------------------------------------------------


def test_a_limit_is_created_read_replaced_and_deleted(http: httpx.Client, meter: Meter) -> None:
    definition = {
        "maximum": 100,
        "period": "1mo",
        "window": "calendar",
        "enforcement": "soft",
        "thresholds": [100, 80],
    }
    created = http.put("/v1/limits/exports", json=definition)
    assert created.status_code == 200
    stored = {
        "name": "exports",
        "maximum": 100,
        "period": "1mo",
        "algorithm": "fixed_window",
        "window": "calendar",
        "enforcement": "soft",
        "thresholds": [80, 100],
        "lateness": "1d",
        "thresholds_units": [],
        "dimensions": [],
        "distinct": None,
        "aggregation": "sum",
    }
    assert created.json() == stored
    assert meter.get_limit("exports") == Limit(
        "exports", 100, "1mo", window="calendar", enforcement="soft", thresholds=(80, 100)
    )
    assert http.get("/v1/limits/exports").json() == stored
    # The API's own rate limit (metering.api.ratelimit, reserved) only with ?all=true.
    everything = [limit.to_dict() for limit in meter.list_limits()]
    assert http.get("/v1/limits", params={"all": "true"}).json() == {"limits": everything}
    assert http.get("/v1/limits").json() == {
        "limits": [limit for limit in everything if not limit["name"].startswith("metering.")]
    }
    assert [limit["name"] for limit in http.get("/v1/limits").json()["limits"]] == [
        "api_calls",
        "exports",
        "seats",
    ]

    # A PUT replaces the whole definition: what it leaves out takes its default.
    replaced = http.put(
        "/v1/limits/exports", json={"name": "exports", "maximum": 5, "period": "1d"}
    )
    assert replaced.json() == {
        **stored,
        "maximum": 5,
        "period": "1d",
        "window": "first_use",
        "enforcement": "hard",
        "thresholds": [],
    }
    bucket = http.put(
        "/v1/limits/burst", json={"maximum": 10, "period": "10s", "algorithm": "token_bucket"}
    )
    assert bucket.status_code == 200
    assert meter.get_limit("burst").algorithm == "token_bucket"

    deleted = http.delete("/v1/limits/exports")
    assert (deleted.status_code, deleted.content) == (204, b"")
    with pytest.raises(UnknownLimit):
        meter.get_limit("exports")
    problem(http.get("/v1/limits/exports"), 404, "not-found")
    problem(http.delete("/v1/limits/exports"), 404, "not-found")


BAD_LIMITS: list[tuple[str, Any, str]] = [
    ("no maximum", {"period": "1h"}, "maximum"),
    ("no period", {"maximum": 5}, "period"),
    ("zero maximum", {"maximum": 0, "period": "1h"}, "maximum"),
    ("fractional maximum", {"maximum": 1.5, "period": "1h"}, "maximum"),
    ("string maximum", {"maximum": "5", "period": "1h"}, "maximum"),
    ("huge maximum", {"maximum": 10**30, "period": "1h"}, "maximum"),
    ("not a period", {"maximum": 5, "period": "5 parsecs"}, "period"),
    ("eleven years", {"maximum": 5, "period": "11y"}, "period"),
    ("unknown algorithm", {"maximum": 5, "period": "1h", "algorithm": "leaky"}, "algorithm"),
    (
        "soft bucket",
        {"maximum": 5, "period": "1h", "algorithm": "token_bucket", "enforcement": "soft"},
        "enforcement",
    ),
    ("monthly bucket", {"maximum": 5, "period": "1mo", "algorithm": "token_bucket"}, "period"),
    (
        "calendar bucket",
        {"maximum": 5, "period": "10s", "algorithm": "token_bucket", "window": "calendar"},
        "window",
    ),
    ("unknown window", {"maximum": 5, "period": "1h", "window": "rolling"}, "window"),
    ("zero threshold", {"maximum": 5, "period": "1h", "thresholds": [0]}, "thresholds"),
    ("string thresholds", {"maximum": 5, "period": "1h", "thresholds": "80"}, "thresholds"),
    ("monthly lateness", {"maximum": 5, "period": "1h", "lateness": "1mo"}, "lateness"),
    ("unknown field", {"maximum": 5, "period": "1h", "max": 5}, "max"),
    ("another name", {"name": "other", "maximum": 5, "period": "1h"}, "name"),
    ("an array", [{"maximum": 5, "period": "1h"}], "body"),
]


def test_a_bad_limit_is_400_naming_the_field_and_nothing_changes(
    http: httpx.Client, meter: Meter
) -> None:
    before = meter.list_limits()
    assert {limit.name for limit in before} >= {"api_calls", "seats"}
    for name in ("api_calls", "fresh"):  # replacing one, and creating one
        for case, body, field in BAD_LIMITS:
            answer = http.put(f"/v1/limits/{name}", json=body)
            problem(answer, 400, "invalid-input", field, f"{name}: {case}")
    assert meter.list_limits() == before
    assert meter.get_limit("api_calls") == LIMITS[0]


def test_limit_names_and_bodies_that_are_not_json(http: httpx.Client, meter: Meter) -> None:
    before = meter.list_limits()
    for method in ("GET", "PUT", "DELETE"):
        answer = http.request(
            method, "/v1/limits/Not%20A%20Name", json={"maximum": 1, "period": "1h"}
        )
        problem(answer, 400, "invalid-input", "name")
    problem(
        http.put("/v1/limits/fresh", content=b"maximum: 5", headers={"content-type": "text/yaml"}),
        415,
        "unsupported-media-type",
    )
    problem(
        http.put(
            "/v1/limits/fresh",
            content=b'{"maximum": NaN, "period": "1h"}',
            headers={"content-type": "application/json"},
        ),
        400,
        "invalid-input",
        "body",
    )
    assert meter.list_limits() == before


def test_limits_on_the_embedded_default_the_app_opens_itself(
    serve_api_shared: Serve, tmp_path: Path
) -> None:
    """No meter given: the app opens SQLite and the embedded broker itself, as
    ``metering serve`` does with no configuration, and closes them at shutdown."""
    database = f"sqlite:///{tmp_path}/own.db"
    settings = Settings(database, f"sqla+sqlite:///{tmp_path}/own-broker.db")
    with http_client(base_url=serve_api_shared(create_api(settings)), timeout=30) as client:
        names = [limit["name"] for limit in client.get("/v1/limits").json()["limits"]]
        assert "calls" not in names
        put = client.put("/v1/limits/calls", json={"maximum": 3, "period": "1d"})
        assert put.status_code == 200
        problem(
            client.put("/v1/limits/calls", json={"maximum": -3, "period": "1d"}),
            400,
            "invalid-input",
            "maximum",
        )
        reserved = client.post(
            "/v1/reservations", json={"subject": "org-1", "limit": "calls", "cost": 3}
        ).json()
        assert reserved["state"] == "held"
    with Meter(database) as reader:
        assert reader.get_limit("calls") == Limit("calls", 3, "1d")
        assert [c.used for c in reader.counters("org-1", "calls")] == [3]


# -- reports ----------------------------------------------------------------------

INJECTION = '=HYPERLINK("http://evil.example","x")'


def record_november(meter: Meter, clock: FrozenClock) -> None:
    """A soft limit with overage, a hard one with a denial, a subject that is a formula."""
    meter.set_limit(Limit("calls", maximum=2, period="1mo", window="calendar", enforcement="soft"))
    events = [
        ("2026-11-03T10:00:00", "org-1", "calls", 5),
        ("2026-11-04T10:00:00", INJECTION, "calls", 1),
        ("2026-11-05T10:00:00", "org-2", "seats", 2),
        ("2026-11-06T10:00:00", "org-2", "seats", 4),  # denied: 2 + 4 > 3
        ("2026-10-20T10:00:00", "org-1", "calls", 1),  # October
    ]
    for when, subject, limit, cost in events:
        clock.set(datetime.fromisoformat(when).replace(tzinfo=UTC))
        meter.consume(subject, limit, cost)
    clock.set(NOW)


def test_overage_as_json_and_as_the_clis_csv(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    record_november(meter, clock)
    expected = overage_report(meter, period="2026-11")
    assert len(expected) == 3

    as_json = http.get("/v1/reports/overage", params={"period": "2026-11"})
    assert as_json.status_code == 200
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json() == {
        "report": "overage",
        "period": "2026-11",
        "since": "2026-11-01T00:00:00+00:00",
        "until": "2026-12-01T00:00:00+00:00",
        "rows": [row.to_dict() for row in expected],
    }
    figures = {
        (r["subject"], r["limit"]): (r["overage"], r["denied"], r["denied_events"])
        for r in as_json.json()["rows"]
    }
    # Overage is billable usage (soft); the hard limit's denial is denied, never overage.
    assert figures == {
        ("org-1", "calls"): (3, 0, 0),
        ("org-2", "seats"): (0, 4, 1),
        (INJECTION, "calls"): (0, 0, 0),
    }

    as_csv = http.get(
        "/v1/reports/overage", params={"period": "2026-11"}, headers={"accept": "text/csv"}
    )
    assert as_csv.status_code == 200
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    written = io.StringIO(newline="")
    write_csv(expected, written)
    assert as_csv.text == written.getvalue()
    parsed = list(csv.DictReader(io.StringIO(as_csv.text, newline="")))
    assert len(parsed) == 3
    [injected] = [row for row in parsed if "HYPERLINK" in row["subject"]]
    assert injected["subject"] == "'" + INJECTION  # shown as text, never run

    top = http.get(
        "/v1/reports/overage", params={"period": "2026-11", "top": 1, "limit": "calls"}
    ).json()
    assert [(r["subject"], r["overage"]) for r in top["rows"]] == [("org-1", 3)]
    since = http.get(
        "/v1/reports/overage", params={"since": "2026-10-01", "until": "2026-11-01"}
    ).json()
    assert (since["period"], [r["used"] for r in since["rows"]]) == (
        "2026-10-01 to 2026-10-31",
        [1],
    )


def test_usage_of_one_subject(http: httpx.Client, meter: Meter, clock: FrozenClock) -> None:
    record_november(meter, clock)
    answer = http.get("/v1/reports/usage", params={"subject": "org-1"})
    assert answer.json()["report"] == "usage"
    assert answer.json()["rows"] == [r.to_dict() for r in usage_report(meter, "org-1")]
    assert [r["window_start"][:7] for r in answer.json()["rows"]] == ["2026-10", "2026-11"]
    empty = http.get(
        "/v1/reports/usage", params={"subject": "nobody"}, headers={"accept": "text/csv"}
    )
    assert empty.text.splitlines() == [",".join(COLUMNS)]
    assert (
        json.loads(http.get("/v1/reports/usage", params={"subject": "nobody"}).text)["rows"] == []
    )


def test_shadow_report_as_json_and_csv(
    http: httpx.Client, meter: Meter, clock: FrozenClock
) -> None:
    meter.set_limit(
        Limit("probe", maximum=3, period="1mo", window="calendar", enforcement="shadow")
    )
    for day, subject, cost in [(3, "org-1", 2), (4, "org-1", 2), (5, INJECTION, 5)]:
        clock.set(datetime(2026, 11, day, 10, tzinfo=UTC))
        assert meter.consume(subject, "probe", cost).allowed  # never denied: shadow
    clock.set(NOW)
    expected = shadow_report(meter, "probe", period="2026-11")
    assert [(r.subject, r.would_deny_cost) for r in expected] == [(INJECTION, 5), ("org-1", 2)]

    as_json = http.get("/v1/reports/shadow", params={"limit": "probe", "period": "2026-11"})
    assert as_json.status_code == 200
    assert as_json.json() == {
        "report": "shadow",
        "period": "2026-11",
        "since": "2026-11-01T00:00:00+00:00",
        "until": "2026-12-01T00:00:00+00:00",
        "limit": "probe",
        "rows": [row.to_dict() for row in expected],
    }
    as_csv = http.get(
        "/v1/reports/shadow", params={"limit": "probe", "top": 1}, headers={"accept": "text/csv"}
    )
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    written = io.StringIO(newline="")
    write_csv(expected[:1], written, "shadow")
    assert as_csv.text == written.getvalue()
    [row] = list(csv.DictReader(io.StringIO(as_csv.text, newline="")))
    assert (row["subject"], row["would_deny_cost"]) == ("'" + INJECTION, "5")
    hard = problem(
        http.get("/v1/reports/shadow", params={"limit": "seats"}), 400, "invalid-input", "limit"
    )
    assert "not shadow" in hard["detail"] and "report overage" in hard["detail"]


ACCEPTS: list[tuple[str | None, str | None]] = [
    (None, "application/json"),
    ("*/*", "application/json"),
    ("application/json", "application/json"),
    ("application/*", "application/json"),
    ("text/csv", "text/csv; charset=utf-8"),
    ("text/*", "text/csv; charset=utf-8"),
    ("text/html, text/csv;q=0.5", "text/csv; charset=utf-8"),
    ("application/json;q=0.5, text/csv", "text/csv; charset=utf-8"),
    ("text/csv;q=0, */*", "application/json"),
    ("TEXT/CSV", "text/csv; charset=utf-8"),
    ("text/html", None),
    ("application/xml, text/plain", None),
    ("text/csv;q=0", None),
    ("application/problem+json", None),
]


def test_accept_chooses_json_or_csv_and_anything_else_is_406(http: httpx.Client) -> None:
    for accept, media in ACCEPTS:
        # httpx always sends Accept (*/* by default): None sends it empty, as good as none.
        answer = http.get("/v1/reports/overage", headers={"accept": accept or ""})
        if media is None:
            problem(answer, 406, "not-acceptable", case=str(accept))
        else:
            assert answer.status_code == 200, accept
            assert answer.headers["content-type"] == media, accept
            assert answer.headers["vary"] == "Accept", accept


BAD_FILTERS: list[tuple[str, dict[str, Any], int, str, str]] = [
    ("overage", {"period": "2026-13"}, 400, "invalid-input", "period"),
    ("overage", {"period": "November"}, 400, "invalid-input", "period"),
    ("overage", {"since": "yesterday"}, 400, "invalid-input", "since"),
    ("overage", {"since": "2026-11-10", "until": "2026-11-01"}, 400, "invalid-input", "since"),
    ("overage", {"period": "2026-11", "since": "2026-11-01"}, 400, "invalid-input", "period"),
    ("overage", {"until": "0001-01-01T00:00:00+01:00"}, 400, "invalid-input", "until"),
    ("overage", {"top": 0}, 400, "invalid-input", "top"),
    ("overage", {"top": "all"}, 400, "invalid-input", "top"),
    ("overage", {"subject": " org-1"}, 400, "invalid-input", "subject"),
    ("overage", {"limit": "Not A Name"}, 400, "invalid-input", "limit"),
    ("overage", {"limit": "nope"}, 422, "unknown-limit", "limit"),
    ("usage", {}, 400, "invalid-input", "subject"),
    ("usage", {"subject": "org-1", "limit": "nope"}, 422, "unknown-limit", "limit"),
    ("shadow", {}, 400, "invalid-input", "limit"),
    ("shadow", {"limit": "nope"}, 422, "unknown-limit", "limit"),
    ("shadow", {"limit": "seats"}, 400, "invalid-input", "limit"),
    ("shadow", {"limit": "Not A Name"}, 400, "invalid-input", "limit"),
    ("shadow", {"limit": "seats", "period": "2026-13"}, 400, "invalid-input", "period"),
    ("shadow", {"limit": "seats", "since": "soon"}, 400, "invalid-input", "since"),
    ("shadow", {"limit": "seats", "top": 0}, 400, "invalid-input", "top"),
    ("shadow", {"limit": "seats", "subject": " x"}, 400, "invalid-input", "subject"),
]


def test_bad_report_filters_are_problems(http: httpx.Client) -> None:
    for path, params, status, slug, field in BAD_FILTERS:
        for accept in ("application/json", "text/csv"):
            answer = http.get(f"/v1/reports/{path}", params=params, headers={"accept": accept})
            problem(answer, status, slug, field, f"{path} {params} {accept}")


ROWS = 2000
GATE = 1000


@pytest.fixture
def gated_rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`Report.rows` counting the rows it reads, holding at row `GATE` until
    ``state["go"]`` is set, and noting when its cursor is closed."""
    state: dict[str, Any] = {"read": 0, "go": threading.Event(), "closed": threading.Event()}
    original = Report.rows

    def rows(report: Report) -> Iterator[Any]:
        inner = original(report)
        try:
            for row in inner:
                if state["read"] == GATE:
                    assert state["go"].wait(30), "the test never let the report go on"
                state["read"] += 1
                yield row
        finally:
            inner.close()
            state["closed"].set()

    monkeypatch.setattr(Report, "rows", rows)
    yield state
    state["go"].set()


def _many_subjects(meter: Meter) -> None:
    meter.set_limit(Limit("calls", maximum=2, period="1mo", window="calendar", enforcement="soft"))
    meter.apply([make_event([(f"s-{i:05d}", "calls", 3)], NOW) for i in range(ROWS)])


@pytest.mark.parametrize("accept", ["text/csv", "application/json"])
def test_a_report_streams_while_the_database_is_read(
    http: httpx.Client, meter: Meter, gated_rows: dict[str, Any], accept: str
) -> None:
    _many_subjects(meter)
    with http.stream("GET", "/v1/reports/overage", headers={"accept": accept}) as answer:
        assert answer.status_code == 200
        assert "content-length" not in answer.headers
        assert answer.headers["transfer-encoding"] == "chunked"
        pieces = answer.iter_bytes()
        first = next(pieces)
        # The client holds the start of the report while the server has read
        # only part of the rows: they are not all built before the answer.
        assert first
        assert gated_rows["read"] <= GATE < ROWS
        assert not gated_rows["closed"].is_set()
        # Meanwhile writers go on, on SQLite too (a reader takes no write lock).
        _write_within(meter, seconds=10)
        gated_rows["go"].set()
        text = (first + b"".join(pieces)).decode()
    assert gated_rows["read"] == ROWS
    assert gated_rows["closed"].wait(10)
    if accept == "text/csv":
        parsed = list(csv.DictReader(io.StringIO(text, newline="")))
        assert len(parsed) == ROWS
        assert {row["overage"] for row in parsed} == {"1"}
    else:
        rows = json.loads(text)["rows"]
        assert len(rows) == ROWS
        assert rows[0] == overage_report(meter)[0].to_dict()


def test_a_client_that_leaves_midway_closes_the_cursor(
    http: httpx.Client, meter: Meter, gated_rows: dict[str, Any]
) -> None:
    _many_subjects(meter)
    with http.stream("GET", "/v1/reports/overage", headers={"accept": "text/csv"}) as answer:
        assert next(answer.iter_bytes())
    # The client is gone; the server, let go, stops reading and closes the cursor.
    gated_rows["go"].set()
    assert gated_rows["closed"].wait(15)
    assert gated_rows["read"] < ROWS
    _write_within(meter, seconds=10)


def _write_within(meter: Meter, seconds: float) -> None:
    """A consume from another thread is done within ``seconds``."""
    done: list[Any] = []
    writer = threading.Thread(target=lambda: done.append(meter.consume("org-9", "calls", 1)))
    writer.start()
    writer.join(seconds)
    assert not writer.is_alive(), "a write waited on the report's reader"
    assert done[0].allowed


# -- webhook endpoints ------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        if server.is_running():
            server.stop()


SECRET = "whsec_" + base64.b64encode(bytes(range(24))).decode()


def test_endpoints_are_managed_and_the_secret_is_shown_once(
    http: httpx.Client, meter: Meter
) -> None:
    created = http.post(
        "/v1/webhooks/endpoints",
        json={"url": "https://hooks:pw@billing.example.com/in", "types": ["limit.denied"]},
    )
    assert created.status_code == 201
    assert created.json()["warnings"] == []
    secret = created.json()["secret"]
    endpoint = created.json()["endpoint"]
    assert secret.startswith("whsec_")
    assert endpoint == {
        "id": endpoint["id"],
        "url": "https://hooks:***@billing.example.com/in",
        "types": ["limit.denied"],
        "enabled": True,
        "disabled_reason": None,
        "secret_masked": "whsec_…" + secret[-4:],
        "secret_encrypted": False,
        "rotating_until": None,
        "created_at": NOW.isoformat(),
    }
    path = f"/v1/webhooks/endpoints/{endpoint['id']}"
    answers = [
        http.get("/v1/webhooks/endpoints"),
        http.get(path),
        http.patch(path, json={"url": "https://billing.example.com/v2", "types": []}),
        http.post(f"{path}/disable"),
        http.get(path),
        http.post(f"{path}/enable"),
    ]
    assert [a.status_code for a in answers] == [200] * 6
    for answer in answers:
        assert secret not in answer.text and "pw@" not in answer.text
    assert answers[0].json() == {"endpoints": [endpoint]}
    assert (answers[2].json()["url"], answers[2].json()["types"]) == (
        "https://billing.example.com/v2",
        [],
    )
    assert (answers[3].json()["enabled"], answers[3].json()["disabled_reason"]) == (
        False,
        "disabled by an operator",
    )
    assert answers[4].json()["enabled"] is False and answers[5].json()["enabled"] is True

    rotated = http.post(f"{path}/rotate", json={"grace_seconds": 60})
    assert rotated.status_code == 200
    new_secret = rotated.json()["secret"]
    assert new_secret.startswith("whsec_") and new_secret != secret
    assert rotated.json()["endpoint"]["rotating_until"] == (NOW + timedelta(seconds=60)).isoformat()
    assert rotated.json()["endpoint"]["secret_masked"] == "whsec_…" + new_secret[-4:]
    listed = http.get("/v1/webhooks/endpoints").text
    assert new_secret not in listed and secret not in listed
    given = http.post(f"{path}/rotate", json={"secret": SECRET})  # the body's own secret
    assert given.json()["secret"] == SECRET

    [stored] = Webhooks(meter).endpoints()
    assert (stored.url, stored.types, stored.enabled) == (
        "https://billing.example.com/v2",
        (),
        True,
    )
    deleted = http.delete(path)
    assert (deleted.status_code, deleted.content) == (204, b"")
    problem(http.get(path), 404, "not-found")
    assert Webhooks(meter).endpoints() == []


def test_a_ping_is_signed_listed_and_replayed(
    http: httpx.Client, meter: Meter, receiver: HTTPServer
) -> None:
    receiver.expect_request("/ok", method="POST").respond_with_data("", status=204)
    receiver.expect_request("/down", method="POST").respond_with_data("no", status=500)
    ok = http.post(
        "/v1/webhooks/endpoints", json={"url": receiver.url_for("/ok"), "secret": SECRET}
    ).json()["endpoint"]
    down = http.post("/v1/webhooks/endpoints", json={"url": receiver.url_for("/down")}).json()[
        "endpoint"
    ]

    delivered = http.post(f"/v1/webhooks/endpoints/{ok['id']}/test")
    assert delivered.status_code == 200
    ping = delivered.json()
    assert (ping["type"], ping["endpoint_id"], ping["status"], ping["attempts"]) == (
        "webhook.test",
        ok["id"],
        "delivered",
        1,
    )
    assert [a["status_code"] for a in ping["attempt_log"]] == [204]
    [(request, _)] = [entry for entry in receiver.log if entry[0].path == "/ok"]
    verify(request.get_data(), dict(request.headers), SECRET, now=NOW)
    assert json.loads(request.get_data())["data"] == {"endpoint_id": ok["id"]}

    failed = http.post(f"/v1/webhooks/endpoints/{down['id']}/test").json()
    assert (failed["status"], failed["last_status_code"]) == ("failed", 500)

    listed = http.get("/v1/webhooks/deliveries").json()["deliveries"]
    assert [d["id"] for d in listed] == [failed["id"], ping["id"]]
    assert listed[1] == ping
    only_failed = http.get("/v1/webhooks/deliveries", params={"status": "failed"}).json()
    assert [d["id"] for d in only_failed["deliveries"]] == [failed["id"]]
    to_ok = http.get("/v1/webhooks/deliveries", params={"endpoint_id": ok["id"], "count": 1})
    assert [d["id"] for d in to_ok.json()["deliveries"]] == [ping["id"]]

    replayed = http.post("/v1/webhooks/deliveries/replay", json={"delivery_ids": [failed["id"]]})
    assert replayed.json() == {"queued": 1}
    pending = http.get("/v1/webhooks/deliveries", params={"status": "pending"}).json()
    [again] = pending["deliveries"]
    assert (again["id"], again["attempts"], again["next_attempt_at"]) == (
        failed["id"],
        0,
        NOW.isoformat(),
    )
    assert len(again["attempt_log"]) == 1  # past attempts stay recorded

    missing = http.post(
        "/v1/webhooks/deliveries/replay", json={"delivery_ids": [ping["id"], 987654]}
    )
    body = problem(missing, 404, "not-found")
    assert body["delivery_ids"] == [987654]
    assert "1 of 2 queued again" in body["detail"]
    since = http.post("/v1/webhooks/deliveries/replay", json={"since": NOW.isoformat()})
    assert since.json() == {"queued": 2}
    assert {d.status for d in Webhooks(meter).deliveries()} == {"pending"}


def test_a_ping_to_a_private_address_is_refused_by_default(
    serve_api_shared: Serve, meter: Meter, tmp_path: Path, receiver: HTTPServer
) -> None:
    receiver.expect_request("/hooks").respond_with_data("", status=204)
    with serve(
        serve_api_shared, meter, tmp_path, delivery=DeliverySettings(timeout_seconds=5)
    ) as client:
        added = client.post("/v1/webhooks/endpoints", json={"url": receiver.url_for("/hooks")})
        ping = client.post(f"/v1/webhooks/endpoints/{added.json()['endpoint']['id']}/test").json()
    # The answer to the add warned of it, naming the settings that allow it.
    (warning,) = added.json()["warnings"]
    assert warning.startswith("deliveries will be refused: 127.0.0.1 resolves to 127.0.0.1")
    assert "METERING_WEBHOOKS_ALLOW_PRIVATE=1" in warning
    assert "METERING_WEBHOOKS_ALLOW_NETWORKS" in warning
    assert ping["status"] == "failed"
    assert "METERING_WEBHOOKS_ALLOW_PRIVATE" in ping["last_error"]
    assert receiver.log == []


BAD_ENDPOINTS: list[tuple[str, Any, str]] = [
    ("no url", {}, "url"),
    ("ftp", {"url": "ftp://example.com/"}, "url"),
    ("number url", {"url": 5}, "url"),
    ("spaces", {"url": "https://example.com/a b"}, "url"),
    ("types as text", {"url": "https://example.com/", "types": "limit.denied"}, "types"),
    ("unknown type", {"url": "https://example.com/", "types": ["limit.nope"]}, "types"),
    ("number types", {"url": "https://example.com/", "types": [1]}, "types"),
    ("empty secret", {"url": "https://example.com/", "secret": ""}, "secret"),
    ("not base64", {"url": "https://example.com/", "secret": "not base64!"}, "secret"),
    ("short secret", {"url": "https://example.com/", "secret": "whsec_AAAA"}, "secret"),
    ("number secret", {"url": "https://example.com/", "secret": 5}, "secret"),
    ("unknown field", {"url": "https://example.com/", "name": "x"}, "name"),
    ("an array", [{"url": "https://example.com/"}], "body"),
]


def test_a_bad_endpoint_is_400_and_none_is_added(http: httpx.Client, meter: Meter) -> None:
    for case, body, field in BAD_ENDPOINTS:
        answer = http.post("/v1/webhooks/endpoints", json=body)
        problem(answer, 400, "invalid-input", field, case)
    problem(
        http.post("/v1/webhooks/endpoints", content=b"url=https://example.com/"),
        415,
        "unsupported-media-type",
    )
    assert Webhooks(meter).endpoints() == []


def test_bad_changes_leave_the_endpoint_as_it_was(http: httpx.Client, meter: Meter) -> None:
    created = http.post(
        "/v1/webhooks/endpoints", json={"url": "https://example.com/in", "types": ["limit.reset"]}
    ).json()
    path = f"/v1/webhooks/endpoints/{created['endpoint']['id']}"
    cases: list[tuple[str, str, Any, str]] = [
        ("PATCH", path, {"url": "mailto:ops@example.com"}, "url"),
        ("PATCH", path, {"types": ["limit.nope"]}, "types"),
        ("PATCH", path, {"enabled": False}, "enabled"),
        ("POST", f"{path}/rotate", {"grace_seconds": -1}, "grace_seconds"),
        ("POST", f"{path}/rotate", {"grace_seconds": "1h"}, "grace_seconds"),
        ("POST", f"{path}/rotate", {"grace_seconds": 400 * 86_400}, "grace_seconds"),
        ("POST", f"{path}/rotate", {"secret": ""}, "secret"),
    ]
    for method, target, body, field in cases:
        problem(http.request(method, target, json=body), 400, "invalid-input", field)
    problem(
        http.patch(path, content=b"url=x", headers={"content-type": "text/plain"}),
        415,
        "unsupported-media-type",
    )
    assert http.get(path).json() == created["endpoint"]


BAD_REPLAYS: list[tuple[Any, str]] = [
    ({}, "delivery_ids"),
    ({"delivery_ids": []}, "delivery_ids"),
    ({"delivery_ids": "1"}, "delivery_ids"),
    ({"delivery_ids": [0]}, "delivery_ids[0]"),
    ({"delivery_ids": [1, True]}, "delivery_ids[1]"),
    ({"delivery_ids": [2**63]}, "delivery_ids[0]"),
    ({"delivery_ids": list(range(1, 1002))}, "delivery_ids"),
    ({"since": "yesterday"}, "since"),
    ({"since": 5}, "since"),
    ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
    ({"ids": [1]}, "ids"),
]


def test_bad_replays_are_400(http: httpx.Client) -> None:
    for body, field in BAD_REPLAYS:
        answer = http.post("/v1/webhooks/deliveries/replay", json=body)
        problem(answer, 400, "invalid-input", field, str(body)[:60])


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("GET", ""),
        ("PATCH", ""),
        ("DELETE", ""),
        ("POST", "/enable"),
        ("POST", "/disable"),
        ("POST", "/rotate"),
        ("POST", "/test"),
    ],
)
def test_unknown_and_malformed_endpoint_ids(http: httpx.Client, method: str, suffix: str) -> None:
    body = {"types": []} if method == "PATCH" else None
    unknown = http.request(method, f"/v1/webhooks/endpoints/ep_missing{suffix}", json=body)
    problem(unknown, 404, "not-found")
    malformed = http.request(method, f"/v1/webhooks/endpoints/ep%20x{suffix}", json=body)
    problem(malformed, 400, "invalid-input", "endpoint_id")


def test_bad_delivery_listings(http: httpx.Client) -> None:
    for params, field in [
        ({"status": "lost"}, "status"),
        ({"count": 0}, "count"),
        ({"count": 1001}, "count"),
        ({"endpoint_id": "a b"}, "endpoint_id"),
    ]:
        problem(http.get("/v1/webhooks/deliveries", params=params), 400, "invalid-input", field)


# -- scopes ----------------------------------------------------------------------------

# (method, path, body, the scope it takes): every admin operation.
SCOPED: list[tuple[str, str, Any, str]] = [
    ("POST", "/v1/reservations", {"subject": "org-1", "limit": "seats"}, "ingest"),
    ("POST", "/v1/reservations/r-1/cancel", None, "ingest"),
    ("POST", "/v1/reservations/r-1/commit", None, "ingest"),
    ("GET", "/v1/reservations", None, "read"),
    ("GET", "/v1/reservations/r-1", None, "read"),
    ("GET", "/v1/limits", None, "read"),
    ("GET", "/v1/limits/seats", None, "read"),
    ("PUT", "/v1/limits/later", {"maximum": 1, "period": "1h"}, "admin"),
    ("DELETE", "/v1/limits/later", None, "admin"),
    ("GET", "/v1/reports/overage", None, "read"),
    ("GET", "/v1/reports/usage?subject=org-1", None, "read"),
    ("GET", "/v1/reports/shadow?limit=seats", None, "read"),
    ("GET", "/v1/reports/spend?period=2026-11", None, "read"),
    ("POST", "/v1/webhooks/endpoints", {"url": "https://example.com/"}, "admin"),
    ("GET", "/v1/webhooks/endpoints", None, "admin"),
    ("GET", "/v1/webhooks/endpoints/ep_x", None, "admin"),
    ("PATCH", "/v1/webhooks/endpoints/ep_x", {"types": []}, "admin"),
    ("POST", "/v1/webhooks/endpoints/ep_x/enable", None, "admin"),
    ("POST", "/v1/webhooks/endpoints/ep_x/disable", None, "admin"),
    ("POST", "/v1/webhooks/endpoints/ep_x/rotate", None, "admin"),
    ("POST", "/v1/webhooks/endpoints/ep_x/test", None, "admin"),
    ("DELETE", "/v1/webhooks/endpoints/ep_x", None, "admin"),
    ("GET", "/v1/webhooks/deliveries", None, "admin"),
    ("POST", "/v1/webhooks/deliveries/replay", {"delivery_ids": [1]}, "admin"),
]


def test_each_route_takes_its_scope(http: httpx.Client, meter: Meter) -> None:
    """401 without a key (keys exist), 403 with a key of another scope; an
    admin key may do everything (`metering.apikeys.GRANTS`)."""
    keys = ApiKeys(meter)
    tokens = {scope: keys.create(scope, f"{scope} key")[1] for scope in ("ingest", "read", "admin")}
    assert len(SCOPED) == 24  # every admin operation (the schema test counts them)
    assert {f"{method} {path.split('?')[0]}" for method, path, _, _ in SCOPED} >= {
        f"{m.upper()} {p}"
        for m, p, _ in _admin_operations(http.get("/openapi.json").json())
        if "{" not in p
    }
    for method, path, body, scope in SCOPED:
        case = f"{method} {path}"
        problem(http.request(method, path, json=body), 401, "unauthorized", case=case)
        for holder, token in tokens.items():
            answer = http.request(
                method, path, json=body, headers={"authorization": f"Bearer {token}"}
            )
            if scope == holder or holder == "admin":
                assert answer.status_code not in (401, 403), f"{case} with {holder}: {answer.text}"
            else:
                problem(answer, 403, "forbidden", case=f"{case} with {holder}")


# -- the schema ---------------------------------------------------------------------


def _admin_operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in schema["paths"].items():
        if path.startswith(ADMIN_PREFIXES):
            for method, operation in operations.items():
                yield method, path, operation


def test_every_admin_answer_has_its_shape_in_the_schema(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    found = {f"{method.upper()} {path}" for method, path, _ in _admin_operations(schema)}
    assert found == {
        "POST /v1/reservations",
        "GET /v1/reservations",
        "GET /v1/reservations/{reservation_id}",
        "POST /v1/reservations/{reservation_id}/cancel",
        "POST /v1/reservations/{reservation_id}/commit",
        "GET /v1/limits",
        "GET /v1/limits/{name}",
        "PUT /v1/limits/{name}",
        "DELETE /v1/limits/{name}",
        "GET /v1/reports/overage",
        "GET /v1/reports/usage",
        "GET /v1/reports/shadow",
        "GET /v1/reports/spend",
        "POST /v1/webhooks/endpoints",
        "GET /v1/webhooks/endpoints",
        "GET /v1/webhooks/endpoints/{endpoint_id}",
        "PATCH /v1/webhooks/endpoints/{endpoint_id}",
        "DELETE /v1/webhooks/endpoints/{endpoint_id}",
        "POST /v1/webhooks/endpoints/{endpoint_id}/enable",
        "POST /v1/webhooks/endpoints/{endpoint_id}/disable",
        "POST /v1/webhooks/endpoints/{endpoint_id}/rotate",
        "POST /v1/webhooks/endpoints/{endpoint_id}/test",
        "GET /v1/webhooks/deliveries",
        "POST /v1/webhooks/deliveries/replay",
    }
    for method, path, operation in _admin_operations(schema):
        answers = operation["responses"]
        assert {"401", "403", "413", "500", "503"} <= set(answers), (method, path)
        assert "422" not in answers or "unknown" in answers["422"]["description"].lower()
        for status, answer in answers.items():
            content = answer.get("content", {})
            if int(status) >= 400:
                assert list(content) == [PROBLEM], (method, path, status)
                assert "Problem" in json.dumps(content[PROBLEM]["schema"]), (method, path, status)
            elif int(status) != 204:
                shape = content["application/json"]["schema"]
                assert shape.get("$ref", "").startswith("#/components/schemas/"), (method, path)
        if method in ("post", "put", "patch") and "requestBody" in operation:
            body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert "$ref" not in json.dumps(body_schema)  # inlined, complete
    assert (
        "text/csv" in schema["paths"]["/v1/reports/overage"]["get"]["responses"]["200"]["content"]
    )


CHECKS = (
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


def test_schemathesis_no_5xx_and_every_answer_conforms(http: httpx.Client) -> None:
    """Generated requests, valid and invalid by the schema, for every admin
    operation: no 5xx, and every answer is a documented status with its
    documented shape. Invalid input where there is something to get wrong (a
    body, a query); a lone path segment is any string."""
    api_schema = schemathesis.openapi.from_url(f"{http.base_url}/openapi.json")
    seen = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith(ADMIN_PREFIXES):
            continue
        seen += 1
        has_input = operation.body or any(
            p.location == "query" for p in operation.iter_parameters()
        )
        modes = (
            [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
            if has_input
            else [GenerationMode.POSITIVE]
        )
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=cases(25),
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            def exchange(case: schemathesis.Case) -> None:
                case.call_and_validate(checks=CHECKS)

            try:
                exchange()
            except hypothesis.errors.Unsatisfiable:
                # Every query parameter optional and free-form: nothing invalid to make.
                assert mode == GenerationMode.NEGATIVE
    assert seen == 24
