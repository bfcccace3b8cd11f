"""`Settings.from_env` reads every worker variable once; task names and queues live in one place."""

from __future__ import annotations

import pytest

from metering.errors import ConfigurationError
from metering.routing import DEFAULT_QUEUE, queue_names, worker_queues
from metering.settings import Settings


def test_defaults_with_no_variable_set() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.queues == 1
    assert settings.visibility_timeout_seconds == 300
    assert settings.webhooks_dispatch


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "METERING_DATABASE_URL": "sqlite:///x.db",
            "METERING_BROKER_URL": "redis://localhost:1/0",
            "METERING_QUEUES": "4",
            "METERING_VISIBILITY_TIMEOUT": "60",
            "METERING_WEBHOOKS_INTERVAL": "2",
            "METERING_WEBHOOKS_POLL_INTERVAL": "0.5",
            "METERING_WEBHOOKS_DISPATCH": "0",
            "METERING_WEBHOOKS_TIMEOUT": "3",
            "METERING_RESERVATION_SWEEP_INTERVAL": "7",
            "METERING_RESERVATION_RETENTION": "3600",
            "METERING_PRUNE_INTERVAL": "120",
            "METERING_RETAIN_RESULTS_DAYS": "never",
        }
    )
    assert (settings.database_url, settings.broker_url) == (
        "sqlite:///x.db",
        "redis://localhost:1/0",
    )
    assert settings.queues == 4
    assert settings.visibility_timeout_seconds == 60
    assert settings.webhooks_interval_seconds == 2
    assert settings.webhooks_poll_seconds == 0.5
    assert not settings.webhooks_dispatch
    assert settings.delivery.timeout_seconds == 3
    assert settings.reservation_sweep_seconds == 7
    assert settings.reservation_retention_seconds == 3600
    assert settings.prune_interval_seconds == 120
    assert settings.retention.results_days is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("METERING_QUEUES", "0"),
        ("METERING_QUEUES", "2.5"),
        ("METERING_VISIBILITY_TIMEOUT", "soon"),
        ("METERING_PRUNE_INTERVAL", "-1"),
        ("METERING_WEBHOOKS_SCHEDULE", "5,-1"),
        ("METERING_RETAIN_WEBHOOKS_DAYS", "nan"),
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
    from metering.producer import UsageProducer

    monkeypatch.setenv("METERING_QUEUES", "3")
    producer = UsageProducer("memory://")
    try:
        assert producer.queues == 3
        assert UsageProducer("memory://", queues=1).queues == 1
    finally:
        producer.discard()
        producer.close()


def test_the_correction_horizon_is_a_whole_number_of_days() -> None:
    from metering.config import correction_horizon_days
    from metering.errors import ConfigurationError
    from metering.settings import Settings

    assert Settings.from_env({}).correction_horizon_days == 35
    assert correction_horizon_days({"METERING_CORRECTION_HORIZON_DAYS": "90"}) == 90
    for bad in ("0", "1.5", "x", "4000"):
        with pytest.raises(ConfigurationError, match="METERING_CORRECTION_HORIZON_DAYS"):
            correction_horizon_days({"METERING_CORRECTION_HORIZON_DAYS": bad})
