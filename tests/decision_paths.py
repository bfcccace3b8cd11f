"""Tests' handles on the engine's decision paths (`metering.engine.paths`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metering.domain.events import EventRecord, Rejected, UsageEvent
from metering.engine import Engine
from metering.engine.answers import Answer, Batch, InvalidPolicy


def without(engine: Engine, name: str) -> None:
    """Take path ``name`` out of ``engine`` (e.g. the one-trip function)."""
    engine.paths = [path for path in engine.paths if path.name != name]


class Refusing:
    """A path that calls ``refuse`` (which fails the test) when it is asked
    to apply (``applies``) or to check (``checks``); else ``path`` answers."""

    def __init__(self, path: Any, refuse: Any, applies: bool, checks: bool) -> None:
        self.name = path.name
        self.implements = path.implements
        self.path, self.refuse, self.applies, self.checks = path, refuse, applies, checks

    def apply(self, batch: Batch) -> Any:
        return self.refuse(batch) if self.applies else self.path.apply(batch)

    def check(self, event: UsageEvent, now_us: int) -> Any:
        return self.refuse(event) if self.checks else self.path.check(event, now_us)


def refusing(engine: Engine, refuse: Any, *, applies: bool = True, checks: bool = True) -> None:
    """The reference path of ``engine`` calls ``refuse`` when it is asked
    to apply (``applies``) or to check (``checks``)."""
    engine.paths = [
        Refusing(path, refuse, applies, checks) if path.name == "reference" else path
        for path in engine.paths
    ]


def apply_reference(
    engine: Engine,
    records: Sequence[EventRecord],
    now_us: int,
    invalid: InvalidPolicy = "reject",
    rejected: Sequence[Rejected] = (),
) -> list[Answer]:
    """``records`` applied by the reference engine alone."""
    found = engine.path("reference").apply(Batch(records, now_us, invalid, rejected))
    assert isinstance(found, list)
    return found


def check_reference(engine: Engine, event: UsageEvent, now_us: int) -> Any:
    """``event`` checked by the reference engine alone."""
    return engine.path("reference").check(event, now_us)
