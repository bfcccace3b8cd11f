"""Where queued work goes (`metering/pipeline/routing.py`): one queue, or a subject's
stable hash among N, and a worker consumes the default queue first."""

from __future__ import annotations

import zlib

from metering.pipeline.routing import DEFAULT_QUEUE, queue_for, queue_names, worker_queues


def test_with_one_queue_everything_goes_to_the_default() -> None:
    assert queue_for("org-1", 1) == queue_for("org-2", 0) == DEFAULT_QUEUE == "metering"
    assert queue_names(1) == queue_names(0) == ["metering"]
    assert worker_queues(1) == ["metering"]


def test_a_subject_has_one_queue_among_n_by_its_hash() -> None:
    subjects = [f"org-{n}" for n in range(200)]
    routed = {subject: queue_for(subject, 4) for subject in subjects}
    assert routed == {subject: queue_for(subject, 4) for subject in subjects}  # stable
    assert set(routed.values()) == set(queue_names(4))
    assert queue_for("é", 7) == f"metering.{zlib.crc32('é'.encode()) % 7}"


def test_n_queues_are_numbered_and_a_worker_takes_the_default_first() -> None:
    assert queue_names(3) == ["metering.0", "metering.1", "metering.2"]
    assert worker_queues(3) == ["metering", "metering.0", "metering.1", "metering.2"]
