"""A worker logs Celery's lines about its periodic tasks (received, succeeded,
sent by beat) at DEBUG: at INFO they would fill its log with no news."""

from __future__ import annotations

import logging

import pytest

from workers.app import app
from workers.observability import TASK_LOGGERS, PeriodicAtDebug, log_periodic_at_debug

SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s"


def test_periodic_task_lines_are_debug_and_others_stay_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduled = [entry["task"] for entry in app.conf.beat_schedule.values()]
    log_periodic_at_debug(["metering.prune"])
    try:
        logged(caplog)
    finally:
        log_periodic_at_debug(scheduled)  # as the worker app installed it


def logged(caplog: pytest.LogCaptureFixture) -> None:
    trace = logging.getLogger("celery.app.trace")
    periodic = {"name": "metering.prune", "id": "1", "runtime": 0.01, "return_value": None}
    other = {**periodic, "name": "metering.apply_batch"}
    with caplog.at_level(logging.INFO):
        trace.info(SUCCESS, periodic)
        trace.info(SUCCESS, other)
        logging.getLogger("celery.beat").info(
            "Scheduler: Sending due task %s (%s)", "prune", "metering.prune"
        )
    assert [(r.levelname, r.args["name"]) for r in caplog.records] == [  # type: ignore[call-overload,index]
        ("INFO", "metering.apply_batch")
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        trace.info(SUCCESS, periodic)
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


def test_the_worker_app_quiets_every_scheduled_task() -> None:
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    for name in TASK_LOGGERS:
        [quiet] = [f for f in logging.getLogger(name).filters if isinstance(f, PeriodicAtDebug)]
        assert scheduled <= quiet.tasks
