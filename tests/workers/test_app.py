"""The Celery app (`workers/app.py`), configured from `metering.settings.Settings`:
the guarded Redis transport and its visibility options, the embedded broker's
own, the queues a worker consumes (the default one always), late acks of
JSON tasks, beat's schedule from the settings; an impossible setting stops
the worker before it takes a message."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fresh import run_fresh

from metering.errors import ConfigurationError
from metering.pipeline.routing import DEFAULT_QUEUE, worker_queues
from metering.settings import Settings
from workers.app import ConsumeDefaultQueue, create_app

REDIS = "redis://127.0.0.1:1/0"


def test_a_redis_worker_is_guarded_and_looks_for_lost_messages_in_time() -> None:
    app = create_app(REDIS, Settings(broker_url=REDIS, visibility_timeout_seconds=300))
    assert app.conf.broker_transport == "workers.guard:GuardedRedisTransport"
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == 300
    assert options["unacked_restore_interval"] == options["unacked_mutex_expire"] == 60
    short = create_app(REDIS, Settings(broker_url=REDIS, visibility_timeout_seconds=1))
    assert short.conf.broker_transport_options["unacked_restore_interval"] == 1


def test_the_embedded_broker_has_its_own_transport_and_sweep(tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    app = create_app(broker, Settings(broker_url=broker))
    assert app.conf.broker_transport_options == {}
    assert app.conf.broker_transport != "workers.guard:GuardedRedisTransport"
    assert "sweep-embedded-broker" in app.conf.beat_schedule
    assert "sweep-embedded-broker" not in create_app(REDIS, Settings()).conf.beat_schedule


def test_tasks_are_json_acked_late_and_scheduled_from_the_settings() -> None:
    settings = Settings(
        broker_url=REDIS, queues=3, webhooks_interval_seconds=7, prune_interval_seconds=120
    )
    app = create_app(REDIS, settings)
    conf = app.conf
    assert (conf.task_serializer, conf.accept_content) == ("json", ["json"])
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_consumer == "workers.guard:GuardedConsumer"
    assert sorted(conf.task_queues) == sorted(worker_queues(3))
    assert conf.task_default_queue == DEFAULT_QUEUE
    webhooks = conf.beat_schedule["deliver-webhooks"]
    assert (webhooks["schedule"], webhooks["options"]) == (7, {"expires": 14})
    assert conf.beat_schedule["prune"]["schedule"] == 120
    assert conf.beat_schedule["compact-rollups"]["task"] == "metering.compact_rollups"
    assert conf.beat_scheduler == "workers.beat:HeartbeatScheduler"


def test_a_worker_consumes_the_default_queue_whatever_minus_q_names() -> None:
    app = create_app(REDIS, Settings(broker_url=REDIS, queues=2))
    queues = app.amqp.queues
    queues.select(["metering.0"])  # as ``-Q metering.0`` does
    assert DEFAULT_QUEUE not in queues.consume_from
    ConsumeDefaultQueue(SimpleNamespace(app=app))
    assert sorted(queues.consume_from) == [DEFAULT_QUEUE, "metering.0"]


@pytest.mark.parametrize("queues", ["0", "1.5", "1e20", "nan"])
def test_a_worker_with_an_impossible_queue_count_refuses_to_start(
    queues: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METERING_QUEUES", queues)
    with pytest.raises(ConfigurationError):
        create_app("sqla+sqlite:///unused.db")


def test_a_worker_and_the_api_load_no_alembic_httpx_or_redis_as_they_import() -> None:
    """Alembic is for `metering status` and migrations, httpx for a delivery
    that is due, redis-py for a Redis broker once it is used: none is loaded
    by importing the worker's app or the API (a fresh interpreter: this one
    has them already)."""
    loaded = {"alembic", "httpx", "httpcore", "redis"}
    assert run_fresh("import workers, metering.api", loaded) == ([], [])
