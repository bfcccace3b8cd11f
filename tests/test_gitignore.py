"""The files the examples and the command line create are ignored by git, so a
clone that ran them still shows a clean ``git status``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A database the README or docs open (``sqlite:///name.db``), in the working directory.
EXAMPLE_DATABASE = re.compile(r"sqlite:///([\w.-]+\.db)\b")
# Report files the docs write in the working directory.
EXAMPLE_REPORTS = ("overage.csv", "overage-2026-11.png", "acme.png", "top.svg", "top.pdf")
DEMO_FILES = (
    ".metering/metering-demo.db",
    ".metering/metering-demo-broker.db",
    ".metering/metering-demo-worker.log",
    ".metering/metering-demo-overage.png",
    ".metering/celerybeat-schedule",
)


def _example_databases() -> list[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = {name for path in texts for name in EXAMPLE_DATABASE.findall(path.read_text())}
    return sorted(found | {"metering.db"})


def _ignored(paths: list[str]) -> set[str]:
    """Which of ``paths`` (relative to the project) git ignores, tracked or not."""
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(paths),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: none is ignored
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return set(done.stdout.split())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_example_databases_and_the_demos_files_are_ignored() -> None:
    databases = _example_databases()
    assert "money-demo.db" in databases and "billing.db" in databases
    created = [
        f"{name}{suffix}" for name in databases for suffix in ("", "-wal", "-shm", "-journal")
    ]
    expected = [*created, *EXAMPLE_REPORTS, *DEMO_FILES]
    assert sorted(set(expected) - _ignored(expected)) == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_projects_own_files_are_not_ignored() -> None:
    kept = [
        "docs/overage-2026-11.png",
        "docs/usage-org-acme.png",
        "deploy/grafana/dashboards/metering.json",
        "metering/storage/migrations/script.py.mako",
        "pyproject.toml",
    ]
    assert _ignored(kept) == set()
