"""The worker's own bootsteps stop their threads on every kind of shutdown.

A warm shutdown calls a step's ``stop``; a cold one (a second SIGTERM,
SIGQUIT, or `start_worker`'s teardown) calls ``terminate``, which bootsteps
leave empty: a step that only had ``stop`` left its thread running.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from metering.settings import Settings
from workers.app import create_app
from workers.heartbeat import WorkerHeartbeat
from workers.webhooks import WebhookDelivery


@pytest.mark.parametrize("step_class", [WebhookDelivery, WorkerHeartbeat])
def test_terminate_stops_the_steps_thread(
    tmp_path: Path, sqlite_url: str, step_class: type
) -> None:
    database_url = sqlite_url  # the schema exists before the thread writes
    settings = Settings(database_url=database_url, broker_url=f"sqla+sqlite:///{tmp_path / 'b.db'}")
    parent = SimpleNamespace(app=create_app(settings.broker_url, settings), hostname="w@test")
    step = step_class(parent)
    step.start(parent)
    thread = step.thread
    assert thread is not None and thread.is_alive()
    step.terminate(parent)
    thread.join(5)
    assert not thread.is_alive()
    assert thread not in threading.enumerate()
