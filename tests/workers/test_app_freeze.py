"""The worker freezes what it built before starting, out of the collector's reach."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from celery import signals

from workers.app import create_app


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_a_starting_worker_freezes_the_objects_it_has_built() -> None:
    assert callable(create_app)  # the app module is imported: its handler is connected
    assert gc.get_freeze_count() == 0
    signals.worker_init.send(sender=None)
    assert gc.get_freeze_count() > 1000
