"""`make test` hands out whole files, longest first (tests/file_order.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from file_order import SECONDS_PER_UNKNOWN_TEST, ordered, recorded, write


@dataclass(frozen=True)
class Item:
    nodeid: str


def ids(tests: list[Item]) -> list[str]:
    return [test.nodeid for test in tests]


def test_files_go_longest_first_and_keep_their_tests_together_in_order() -> None:
    tests = [Item("a.py::one"), Item("b.py::one"), Item("a.py::two"), Item("c.md::line:3")]
    got = ordered(tests, {"a.py": 1.0, "b.py": 30.0, "c.md": 5.0})
    assert ids(got) == ["b.py::one", "c.md::line:3", "a.py::one", "a.py::two"]


def test_an_unknown_file_counts_by_its_number_of_tests() -> None:
    known = 2.5 * SECONDS_PER_UNKNOWN_TEST
    tests = [Item(f"new.py::t{n}") for n in range(3)] + [Item("old.py::t"), Item("tiny.py::t")]
    got = ordered(tests, {"old.py": known})
    assert ids(got) == ["new.py::t0", "new.py::t1", "new.py::t2", "old.py::t", "tiny.py::t"]


def test_durations_add_up_by_file_over_the_old_entries_of_existing_files(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("")
    path = tmp_path / "tests" / "durations.json"
    path.write_text(json.dumps({"a.py": 9.0, "b.py": 4.0, "gone.py": 7.0}))
    write([("a.py::one", 0.25), ("a.py::one", 1.0), ("a.py::two", 0.5)], path)
    assert recorded(path) == {"a.py": 1.8, "b.py": 4.0}


def test_a_missing_or_broken_file_orders_by_counts(tmp_path: Path) -> None:
    assert recorded(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert recorded(tmp_path / "bad.json") == {}
