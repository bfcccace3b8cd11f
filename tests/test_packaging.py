"""The package builds from a clone as `pip install ./metering` builds it: a
wheel holding both packages, every module, the migrations and the package
data, and the `metering` command. (From *inside* the clone the command is
`pip install .`: there ``./metering`` is the import package, not the project.)

The wheel is built without build isolation, with the venv's hatchling (the
``dev`` extra), so the test needs no network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What a clone holds that is not the project's: local state and caches.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    ".metering",
    "*.db",
    "*.db-*",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".tmp",
    "mutants",
    "build",
    "dist",
    "*.egg-info",
)


def _sources(package: str) -> set[str]:
    """The files of ``package`` a wheel must carry: modules and package data."""
    base = ROOT / package
    return {
        path.relative_to(ROOT).as_posix()
        for path in base.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    pytest.importorskip("hatchling", reason="the build backend, in the dev extra")
    where = tmp_path_factory.mktemp("clone")
    shutil.copytree(ROOT, where / "metering", ignore=NOT_IN_A_CLONE, symlinks=True)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*command, "--wheel-dir", "wheels", "./metering"],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [found] = (where / "wheels").glob("metering-*.whl")
    return zipfile.ZipFile(found)


def test_the_wheel_holds_both_packages_the_migrations_and_the_package_data(
    wheel: zipfile.ZipFile,
) -> None:
    names = set(wheel.namelist())
    for package in ("metering", "workers"):
        assert sorted(_sources(package) - names) == [], package
    migrations = [n for n in names if n.startswith("metering/storage/migrations/versions/")]
    assert len(migrations) >= 10, migrations
    for data in ("metering/py.typed", "metering/storage/migrations/script.py.mako"):
        assert data in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "docs/"))]


def test_the_wheel_installs_the_metering_command_and_the_extras(wheel: zipfile.ZipFile) -> None:
    [info] = {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" in n}
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert "metering = metering.cli:main" in entry_points
    metadata = wheel.read(f"{info}/METADATA").decode()
    for extra in ("charts", "tracing"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Requires-Dist: matplotlib>=3.8; extra == 'charts'" in metadata
