"""`Settings.from_env` reads every variable once, and is the one reader of the environment;
task names and queues live in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metering.errors import ConfigurationError
from metering.pipeline.routing import DEFAULT_QUEUE, queue_names, worker_queues
from metering.settings import Settings


def test_defaults_with_no_variable_set() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.queues == 1
    assert settings.visibility_timeout_seconds == 300
    assert settings.broker_max_deliveries == 5
    assert settings.webhooks_dispatch


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "METERING_DATABASE_URL": "sqlite:///x.db",
            "METERING_BROKER_URL": "redis://localhost:1/0",
            "METERING_QUEUES": "4",
            "METERING_VISIBILITY_TIMEOUT": "60",
            "METERING_BROKER_MAX_DELIVERIES": "3",
            "METERING_WEBHOOKS_INTERVAL": "2",
            "METERING_WEBHOOKS_POLL_INTERVAL": "0.5",
            "METERING_WEBHOOKS_DISPATCH": "0",
            "METERING_WEBHOOKS_TIMEOUT": "3",
            "METERING_RESERVATION_SWEEP_INTERVAL": "7",
            "METERING_RESERVATION_RETENTION": "3600",
            "METERING_PRUNE_INTERVAL": "120",
            "METERING_AUDIT_INTERVAL": "900",
            "METERING_RETAIN_RESULTS_DAYS": "never",
            "METERING_API_RETRY_BACKOFF": "0.05",
        }
    )
    assert (settings.database_url, settings.broker_url) == (
        "sqlite:///x.db",
        "redis://localhost:1/0",
    )
    assert settings.queues == 4
    assert settings.visibility_timeout_seconds == 60
    assert settings.broker_max_deliveries == 3
    assert settings.webhooks_interval_seconds == 2
    assert settings.webhooks_poll_seconds == 0.5
    assert not settings.webhooks_dispatch
    assert settings.delivery.timeout_seconds == 3
    assert settings.reservation_sweep_seconds == 7
    assert settings.reservation_retention_seconds == 3600
    assert settings.prune_interval_seconds == 120
    assert settings.audit_interval_seconds == 900
    assert settings.retention.results_days is None
    assert settings.api_retry_backoff_seconds == 0.05


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("METERING_QUEUES", "0"),
        ("METERING_QUEUES", "2.5"),
        ("METERING_VISIBILITY_TIMEOUT", "soon"),
        ("METERING_BROKER_MAX_DELIVERIES", "0"),
        ("METERING_BROKER_MAX_DELIVERIES", "2.5"),
        ("METERING_BROKER_MAX_DELIVERIES", "1001"),
        ("METERING_PRUNE_INTERVAL", "-1"),
        ("METERING_AUDIT_INTERVAL", "often"),
        ("METERING_WEBHOOKS_SCHEDULE", "5,-1"),
        ("METERING_WEBHOOKS_PROXY", "https://proxy.internal:3128"),
        ("METERING_RETAIN_WEBHOOKS_DAYS", "nan"),
        ("METERING_API_RETRY_BACKOFF", "0"),
    ],
)
def test_a_bad_variable_is_a_configuration_error_naming_it(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({name: value})
    assert name.removeprefix("METERING_").split("_")[0] in str(caught.value).upper()


def test_a_worker_always_consumes_the_default_queue() -> None:
    assert worker_queues(1) == [DEFAULT_QUEUE]
    assert worker_queues(3) == [DEFAULT_QUEUE, *queue_names(3)]
    assert queue_names(3) == ["metering.0", "metering.1", "metering.2"]


def test_the_producer_defaults_to_metering_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    from metering.pipeline.producer import UsageProducer

    monkeypatch.setenv("METERING_QUEUES", "3")
    producer = UsageProducer("memory://")
    try:
        assert producer.queues == 3
        assert UsageProducer("memory://", queues=1).queues == 1
    finally:
        producer.discard()
        producer.close()


def test_the_correction_horizon_is_a_whole_number_of_days() -> None:
    from metering.settings import correction_horizon_days

    assert Settings.from_env({}).correction_horizon_days == 35
    assert correction_horizon_days({"METERING_CORRECTION_HORIZON_DAYS": "90"}) == 90
    for bad in ("0", "1.5", "x", "4000"):
        with pytest.raises(ConfigurationError, match="METERING_CORRECTION_HORIZON_DAYS"):
            correction_horizon_days({"METERING_CORRECTION_HORIZON_DAYS": bad})


ROOT = Path(__file__).resolve().parents[2]
# Reading the environment: os.environ, os.getenv, environ imported from os.
READS_ENVIRONMENT = re.compile(r"os\.environ|getenv|from os import .*environ")
# Reviewed exceptions: path -> why it may touch the environment itself.
ENVIRONMENT_ALLOWED = {
    "metering/settings.py": "the one reader: Settings.from_env and each part's reader",
    "metering/telemetry/metrics.py": (
        "PROMETHEUS_MULTIPROC_DIR is prometheus-client's own variable, not a METERING_* "
        "setting: enable_multiprocess sets it for the processes a parent starts, and "
        "prometheus-client (and multiprocess_dir) read it there"
    ),
}


def test_no_module_but_settings_reads_the_environment() -> None:
    """Issue 21, 3: every METERING_* variable is read in `metering.settings`; the
    other modules are handed their settings or ask it for their part."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("metering", "workers")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ENVIRONMENT_ALLOWED
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if READS_ENVIRONMENT.search(line)
    ]
    assert found == []


def test_the_allowed_modules_exist_and_still_need_it() -> None:
    for name in ENVIRONMENT_ALLOWED:
        assert READS_ENVIRONMENT.search((ROOT / name).read_text(encoding="utf-8")), name


def test_one_mapping_gives_every_part_its_settings() -> None:
    """The webhook, retention, API and tracing parts come from the mapping given,
    never from this process's environment."""
    env = {
        "METERING_WEBHOOKS_CONCURRENCY": "3",
        "METERING_RETAIN_REJECTED_DAYS": "7",
        "METERING_API_AUTH": "required",
        "METERING_API_RATE": "off",
        "METERING_METRICS_SCOPE": "read",
        "METERING_CORRECTION_HORIZON_DAYS": "60",
        "OTEL_SERVICE_NAME": "billing",
        "PATH": "/bin",
    }
    settings = Settings.from_env(env)
    assert settings.delivery.max_in_flight == 3
    assert settings.retention.rejected_days == 7
    assert (settings.api_auth, settings.api_rate, settings.metrics_scope) == (
        "required",
        None,
        "read",
    )
    assert settings.correction_horizon_days == 60
    assert settings.otel == (("OTEL_SERVICE_NAME", "billing"),)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "METERING_SQLITE_SYNCHRONOUS",
            "off",
            "METERING_SQLITE_SYNCHRONOUS must be NORMAL or FULL",
        ),
        ("METERING_WEBHOOKS_ROTATION_GRACE", "-1", "METERING_WEBHOOKS_ROTATION_GRACE="),
        ("METERING_API_MAX_EVENTS", "2.5", "METERING_API_MAX_EVENTS must be a whole number"),
    ],
)
def test_the_part_readers_keep_their_messages(name: str, value: str, message: str) -> None:
    from metering import settings

    readers = {
        "METERING_SQLITE_SYNCHRONOUS": settings.sqlite_synchronous,
        "METERING_WEBHOOKS_ROTATION_GRACE": settings.rotation_grace_seconds,
        "METERING_API_MAX_EVENTS": Settings.from_env,
    }
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        readers[name]({name: value})
    # A worker or server stops as it starts, with the same message.
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.from_env({name: value})


def test_a_child_process_gets_this_environment_with_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from metering.settings import child_environment, data_home

    monkeypatch.setenv("METERING_HOME", "/tmp/metering-home-test")
    env = child_environment(METERING_QUEUES="4")
    assert env["METERING_QUEUES"] == "4"
    assert env["METERING_HOME"] == data_home() == "/tmp/metering-home-test"
    assert data_home({}) is None


@pytest.mark.parametrize("value", ["2", "0", "1001", "3.5", "ten", ""])
def test_a_connection_budget_is_a_whole_number_from_3_to_1000(value: str) -> None:
    from metering import settings

    message = "METERING_DB_CONNECTIONS must be a whole number from 3 to 1000"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        settings.db_connections({"METERING_DB_CONNECTIONS": value})
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Settings.from_env({"METERING_DB_CONNECTIONS": value})
    assert settings.db_connections({}) == 10
    assert settings.db_connections({"METERING_DB_CONNECTIONS": "25"}) == 25


def test_a_public_url_is_read_without_its_trailing_slash() -> None:
    env = {"METERING_PUBLIC_URL": "https://metering.example.com/api/"}
    settings = Settings.from_env(env)
    assert settings.public_url == "https://metering.example.com/api"
    assert settings.delivery.public_url == "https://metering.example.com/api"
    assert Settings.from_env({"METERING_PUBLIC_URL": ""}).public_url is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("ftp://metering.example.com", "must be an http or https URL"),
        ("metering.example.com", "must be an http or https URL"),
        ("https://", "must name a host"),
        ("https://metering.example.com/?via=mail", "must have no query or fragment"),
        ("https://metering.example.com/#top", "must have no query or fragment"),
        ("https://ops:secret@metering.example.com", "must not carry a user or password"),
        ("https://metering.example.com:99999", "is not a URL"),
    ],
)
def test_a_bad_public_url_stops_a_worker_as_it_starts(value: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        Settings.from_env({"METERING_PUBLIC_URL": value})
    assert "METERING_PUBLIC_URL" in str(caught.value)
