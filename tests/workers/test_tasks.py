"""The worker's tasks (`workers/tasks.py`), run in this process on a SQLite
file: each hands its argument to one library function on the process's one
`Meter`; a batch is applied (a message of another shape kept as rejected),
and retried with backoff while the database is away; a periodic task that
finds the database away logs one line and returns its empty answer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.app.task import Context
from celery.exceptions import Retry
from servers import free_port

import workers.tasks
from metering import FrozenClock, Limit, Meter
from metering.domain.events import make_event
from metering.errors import DatabaseUnavailable, StorageError
from metering.pipeline.messages import encode_batch, encode_event
from metering.settings import Settings
from workers.app import create_app
from workers.tasks import (
    apply_batch_task,
    deliver_webhooks_task,
    earlier_deliveries,
    prune_task,
    sweep_reservations_task,
    until_next_tick,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def meter(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Meter]:
    url = sqlite_url
    settings = Settings(database_url=url, broker_url=f"sqla+sqlite:///{tmp_path / 'b.db'}")
    monkeypatch.setattr(workers.tasks.app, "metering_settings", settings)
    with Meter(url, clock=FrozenClock(NOW)) as meter:
        meter.set_limit(Limit("calls", maximum=5, period="1h", window="calendar"))
        monkeypatch.setattr(workers.tasks, "_meter", meter)
        yield meter


def test_a_batch_is_applied_and_a_message_of_another_shape_kept(meter: Meter) -> None:
    events = [make_event([("org", "calls", 2)], NOW, f"e-{n}") for n in range(3)]
    report = apply_batch_task(encode_batch([encode_event(e) for e in events]))
    assert meter.decided(["e-0", "e-1", "e-2"]) == {"e-0", "e-1", "e-2"}
    assert sum(report.values()) >= 3
    apply_batch_task("not", "a batch", extra=1)
    [kept] = meter.rejected_messages()
    assert kept.event_id is None and "not a metering batch" in kept.reason


def test_a_batch_is_retried_while_the_database_is_away(
    meter: Meter, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def away(*_args: object, **_kwargs: object) -> None:
        raise DatabaseUnavailable("database unavailable: refused")

    monkeypatch.setattr(workers.tasks, "apply_delivered", away)
    with caplog.at_level(logging.WARNING, logger="workers.tasks"), pytest.raises(Retry):
        apply_batch_task.apply(args=[{}], throw=True)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("batch not applied, retrying in ") and "refused" in line


def test_a_periodic_task_skips_a_tick_while_the_database_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @until_next_tick({"done": 0})
    def sweep() -> dict[str, int]:
        raise StorageError("database unavailable")

    @until_next_tick(0)
    def fine() -> int:
        return 7

    with caplog.at_level(logging.WARNING, logger="workers.tasks"):
        assert sweep() == {"done": 0} and fine() == 7
    [record] = caplog.records
    assert record.getMessage() == "sweep skipped until its next run: database unavailable"
    assert record.exc_info is None  # one line, no traceback


def test_the_sweeps_work_on_the_processs_meter(meter: Meter) -> None:
    held = meter.reserve("org", "calls", 2, ttl_seconds=1)
    meter.clock.advance(seconds=2)  # type: ignore[attr-defined]
    assert sweep_reservations_task()["committed"] == 1
    assert meter.reservation(held.id).state.value == "committed"  # type: ignore[union-attr]
    assert isinstance(prune_task(), dict)
    # Workers deliver from their own thread (dispatching on): beat's task has nothing to do.
    assert set(deliver_webhooks_task().values()) <= {0}


def delivery(app: Celery, task_id: str, redelivered: bool) -> SimpleNamespace:
    """What `earlier_deliveries` reads of a running task: its request and app."""
    request = Context(id=task_id, delivery_info={"redelivered": redelivered})
    return SimpleNamespace(request=request, app=app)


def test_only_a_redelivered_batch_on_redis_counts_its_deliveries(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    on_redis = create_app(redis_url)
    embedded = create_app(f"sqla+sqlite:///{tmp_path / 'b.db'}")
    with caplog.at_level(logging.WARNING, logger="workers.tasks"):
        assert earlier_deliveries(delivery(on_redis, "t-1", redelivered=False)) == 0
        # The embedded broker's sweep bounds its deliveries: nothing is counted.
        assert earlier_deliveries(delivery(embedded, "t-1", redelivered=True)) == 0
    assert not caplog.records
    counts = [earlier_deliveries(delivery(on_redis, "t-1", redelivered=True)) for _ in range(3)]
    assert counts == [1, 2, 3]
    assert earlier_deliveries(delivery(on_redis, "t-2", redelivered=True)) == 1


def test_a_count_redis_cannot_write_applies_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(f"redis://127.0.0.1:{free_port()}/0")
    app.conf.broker_connection_retry = False
    app.conf.broker_connection_timeout = 1
    with caplog.at_level(logging.WARNING, logger="workers.tasks"):
        assert earlier_deliveries(delivery(app, "t-1", redelivered=True)) == 0
    assert "deliveries not counted" in caplog.text
