"""The order `make test` hands test files to its workers: longest first.

pytest-xdist's ``--dist loadfile`` gives a worker a whole file at a time, in
the order of the collection when ``--no-loadscope-reorder`` is given (else
it sorts files by their number of tests, which put the few-test Hypothesis
differentials and the docs pages, minutes each, at the end: one worker idle
while the other finished them). `ordered` sorts the files by the seconds
`durations.json` records for them, longest first, so the last files handed
out are short and both workers finish together. A file it does not know
counts `SECONDS_PER_UNKNOWN_TEST` a test. The order of the tests inside a
file is kept: only whole files move.

`durations.json` is written by ``pytest --write-durations`` (setup, call and
teardown of every test, summed by file; the files of the run replace their
old entries). A stale entry costs only balance, never a test.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

DURATIONS_FILE = Path(__file__).parent / "durations.json"
SECONDS_PER_UNKNOWN_TEST = 0.5


class _Test(Protocol):
    @property
    def nodeid(self) -> str: ...


T = TypeVar("T", bound=_Test)


def file_of(nodeid: str) -> str:
    """The file part of a node id (``docs/api.md::line:3,column:1`` -> ``docs/api.md``)."""
    return nodeid.split("::", 1)[0]


def recorded(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """Seconds per file from ``path``; none when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def ordered(items: Iterable[T], seconds: Mapping[str, float]) -> list[T]:
    """``items`` (pytest's) with whole files sorted by their seconds, longest first."""
    files: dict[str, list[T]] = {}
    for item in items:
        files.setdefault(file_of(item.nodeid), []).append(item)

    def cost(name: str) -> float:
        known = seconds.get(name)
        return known if known is not None else SECONDS_PER_UNKNOWN_TEST * len(files[name])

    return [item for name in sorted(files, key=cost, reverse=True) for item in files[name]]


def write(runs: Iterable[tuple[str, float]], path: Path = DURATIONS_FILE) -> None:
    """Add up ``(nodeid, seconds)`` by file and store them over ``path``'s
    entries; the entries of files that are gone are dropped."""
    totals: dict[str, float] = {}
    for nodeid, duration in runs:
        name = file_of(nodeid)
        totals[name] = totals.get(name, 0.0) + duration
    merged = recorded(path) | {name: round(total, 1) for name, total in totals.items()}
    root = path.parent.parent
    merged = {name: total for name, total in merged.items() if (root / name).is_file()}
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
