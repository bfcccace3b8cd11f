"""Each module has a test file beside it (docs/testing.md gives the rule).

The tests of `metering/PACKAGE/MODULE.py` are in `tests/PACKAGE/`, in a file
named `test_MODULE.py`, `test_MODULE_ASPECT.py`, `test_PKG_MODULE.py` or
`test_PKG_MODULE_ASPECT.py` (PKG: the last folder of PACKAGE). A package's
`__init__.py` counts as the module PKG (but `test_PKG_MODULE*.py` is
MODULE's, not the package's). Top-level modules of `metering/` are
tested in `tests/unit/`, those of `workers/` in `tests/workers/` (PKG is
`metering` or `workers`).

A module without such a file is in one of two lists: `EXEMPT`, with the
reason it has no logic of its own to test, or `NOT_YET`, whose tests are
still to write or to move. Both only shrink: a listed module that now has a
test file, or that no longer exists, fails until it is struck off.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
TESTS = ROOT / "tests"
SOURCES = ("metering", "workers")

# Folders whose modules have no test file of their own.
EXEMPT_FOLDERS: dict[str, str] = {
    "metering/storage/migrations/": "migrations: test_connections_schema.py runs them all",
}

EXEMPT: dict[str, str] = {
    "metering/__init__.py": "re-export face of the package (and its lazy imports)",
    "metering/__main__.py": "`python -m metering` calls the CLI's main",
    "metering/allowances/__init__.py": "re-export face of the allowances",
    "metering/allowances/facade.py": "Meter's methods handed to metering.allowances",
    "metering/domain/__init__.py": "package docstring only",
    "metering/engine/__init__.py": "re-export face of the engine",
    "metering/imports/__init__.py": "re-export face of the import service",
    "metering/imports/facade.py": "Meter's methods handed to metering.imports",
    "metering/limits/__init__.py": "package docstring only",
    "metering/licenses/__init__.py": "re-export face of the licenses",
    "metering/licenses/facade.py": "Meter's methods handed to metering.licenses",
    "metering/money/__init__.py": "re-export face of the money service",
    "metering/money/facade.py": "Meter's methods handed to metering.money",
    "metering/pipeline/__init__.py": "package docstring only (a producer loads nothing more)",
    "metering/reports/__init__.py": "re-export face of the reports",
    "metering/storage/__init__.py": "package docstring only",
    "metering/storage/store.py": "composes the query classes, each tested beside its module",
    "metering/storage/schema_revision.py": "a constant: test_connections_schema.py checks the head",
    "metering/storage/tables.py": "table declarations: test_connections_schema.py checks them",
    "metering/telemetry/__init__.py": "package docstring only",
    "metering/upkeep/__init__.py": "package docstring only",
    "metering/usage/__init__.py": "package docstring only",
    "metering/usage/facade.py": "Meter's methods handed to metering.usage",
    "metering/webhooks/__init__.py": "re-export face of the webhooks",
    "workers/__init__.py": "package docstring only",
    "workers/settings.py": "one cast: the settings a Celery app was made with",
}

# Not yet: modules with logic and no test file beside them, whose tests are to
# move here from elsewhere or to write (not exemptions: strike them off).
NOT_YET: set[str] = set()


def modules() -> list[str]:
    found = [path for source in SOURCES for path in (ROOT / source).rglob("*.py")]
    return sorted(path.relative_to(ROOT).as_posix() for path in found)


def folder_of(module: str) -> Path:
    """Where the tests of `module` (a path such as `metering/storage/limits.py`) are."""
    source, *packages, _ = module.split("/")
    if source == "metering":
        return TESTS.joinpath(*packages) if packages else TESTS / "unit"
    return TESTS.joinpath(source, *packages)


def accepted_names(module: str) -> tuple[str, ...]:
    """The stems a test file of `module` may have, beside an `_ASPECT` suffix."""
    parts = module.removesuffix(".py").split("/")
    package = parts[-2]
    name = package if parts[-1] == "__init__" else parts[-1]
    return (f"test_{name}", f"test_{package}_{name}")


def files_beside(module: str) -> list[Path]:
    folder = folder_of(module)
    if not folder.is_dir():
        return []
    names = accepted_names(module)
    found = [
        path
        for path in folder.glob("test_*.py")
        if any(path.stem == name or path.stem.startswith(f"{name}_") for name in names)
    ]
    if module.endswith("/__init__.py"):
        # test_PKG_MODULE*.py is the file of a module of the package, not of its face.
        package = module.removesuffix("__init__.py")
        siblings = [path for path in found if _names_a_sibling(path.stem, package)]
        found = [path for path in found if path not in siblings]
    return sorted(found)


def _names_a_sibling(stem: str, package: str) -> bool:
    siblings = {path.stem for path in (ROOT / package).glob("*.py")} - {"__init__"}
    rest = stem.removeprefix("test_").split("_", 1)[-1]
    return any(rest == name or rest.startswith(f"{name}_") for name in siblings)


def test_the_rule_places_and_names_the_tests_of_a_module() -> None:
    assert folder_of("metering/storage/hot/sqlite.py") == TESTS / "storage" / "hot"
    assert folder_of("metering/clock.py") == TESTS / "unit"
    assert folder_of("workers/tasks.py") == TESTS / "workers"
    assert accepted_names("metering/api/limits.py") == ("test_limits", "test_api_limits")
    assert accepted_names("metering/cli/__init__.py") == ("test_cli", "test_cli_cli")
    assert accepted_names("metering/pipeline/producer.py") == (
        "test_producer",
        "test_pipeline_producer",
    )
    assert folder_of("metering/pipeline/producer.py") == TESTS / "pipeline"
    assert TESTS / "storage" / "test_counters.py" in files_beside("metering/storage/counters.py")
    assert files_beside("metering/storage/migrations/env.py") == []


def test_every_module_with_logic_has_a_test_file_beside_it() -> None:
    missing = [
        module
        for module in modules()
        if not module.startswith(tuple(EXEMPT_FOLDERS))
        and module not in EXEMPT
        and module not in NOT_YET
        and not files_beside(module)
    ]
    assert missing == [], "add tests/<package>/test_<module>.py (docs/testing.md)"


def test_the_lists_of_modules_without_tests_only_shrink() -> None:
    present = set(modules())
    assert not EXEMPT.keys() & NOT_YET
    gone = sorted((EXEMPT.keys() | NOT_YET) - present)
    assert gone == [], "strike the modules that no longer exist off the lists"
    tested = sorted(module for module in EXEMPT.keys() | NOT_YET if files_beside(module))
    assert tested == [], "strike the modules that now have a test file off the lists"
    assert all(any(module.startswith(folder) for module in present) for folder in EXEMPT_FOLDERS)
    assert all(reason.strip() for reason in (*EXEMPT.values(), *EXEMPT_FOLDERS.values()))


def test_mutation_testing_runs_every_test_file_of_the_domain() -> None:
    """`[tool.mutmut]` names the domain's test files: one moved or added is named there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    selection = config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    domain = sorted(
        path.relative_to(ROOT).as_posix() for path in (TESTS / "domain").glob("test_*.py")
    )
    assert sorted(selection) == domain
