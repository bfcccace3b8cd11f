"""Docstrings and docs stay true: every dotted `metering.…` name in backticks
resolves, no code carries project history (an issue's number), and a module
docstring states its contract in at most `MAX_MODULE_DOCSTRING_LINES` lines; no code
opts out of the formatter or renames what it imports.

A name resolves when its longest importable prefix is a module and the rest
are attributes of it. What is named like a module but is not Python (Celery
task names, queue names, the API's own rate limit) is read from the code
that defines it, so a renamed task is caught too.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

from metering.api.ratelimit import RATE_LIMIT
from metering.pipeline import routing
from metering.storage.redeliveries import REDELIVERIES_KEY

ROOT = Path(__file__).resolve().parent.parent
DOTTED = re.compile(r"`(metering(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
QUEUES = re.compile(r"metering\.(?:N|\d+)")
HISTORY = re.compile(r"\b[Ii]ssue \d+")
# Names that are not Python: task names and the API keys' own limit.
NOT_PYTHON = {
    value
    for value in vars(routing).values()
    if isinstance(value, str) and value.startswith("metering.")
} | {RATE_LIMIT, REDELIVERIES_KEY.rstrip(".")}  # names of queues, headers and Redis keys

MAX_MODULE_DOCSTRING_LINES = 10
# Modules whose docstring is still longer, in packages being reworked elsewhere.
# This list may only shrink: fix a module's docstring and take it off; never add one.
LONG_MODULE_DOCSTRINGS = frozenset(
    {
        "metering/api/admin_common.py",
        "metering/api/allowances.py",
        "metering/api/auth.py",
        "metering/api/bounds.py",
        "metering/api/limits.py",
        "metering/api/models.py",
        "metering/api/prices.py",
        "metering/api/queueing.py",
        "metering/api/ratelimit.py",
        "metering/api/reports.py",
        "metering/api/reservations.py",
        "metering/api/webhooks.py",
        "metering/cli/status.py",
        "metering/engine/core.py",
        "metering/engine/fast.py",
        "metering/engine/group.py",
        "metering/engine/money.py",
        "metering/engine/paths.py",
        "metering/engine/reference.py",
        "metering/telemetry/metrics.py",
        "metering/usage/portal.py",
        "metering/settings.py",
        "metering/storage/hot/__init__.py",
        "metering/storage/hot/direct_postgres.py",
        "metering/storage/hot/postgres.py",
        "metering/storage/hot/sqlite.py",
        "metering/webhooks/delivery.py",
        "metering/webhooks/destinations.py",
        "metering/webhooks/dispatch.py",
        "metering/webhooks/encryption.py",
        "metering/webhooks/endpoints.py",
        "workers/app.py",
        "workers/guard.py",
        "workers/heartbeat.py",
        "workers/observability.py",
    }
)


def sources() -> list[Path]:
    return sorted(
        [*ROOT.joinpath("metering").rglob("*.py"), *ROOT.joinpath("workers").rglob("*.py")]
    )


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for all the tests of this file (read only)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def texts() -> list[tuple[str, str]]:
    """Every docstring of the code, and every page of the docs."""
    found = []
    for path in sources():
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                docstring = ast.get_docstring(node)
                if docstring:
                    found.append((str(path.relative_to(ROOT)), docstring))
    for path in [ROOT / "README.md", *sorted(ROOT.joinpath("docs").glob("*.md"))]:
        found.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    return found


@functools.cache
def resolves(name: str) -> bool:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_dotted_name_resolves() -> None:
    unresolved = sorted(
        {
            (where, name)
            for where, text in texts()
            for name in DOTTED.findall(text)
            if name not in NOT_PYTHON and not QUEUES.fullmatch(name) and not resolves(name)
        }
    )
    assert not unresolved


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("metering.domain.limits.Limit", True),
        ("metering.allowances.alerts", True),
        ("metering.alerts", False),  # moved to metering.allowances
        ("metering.domain.limits.NoSuchThing", False),
    ],
)
def test_resolving_is_not_vacuous(name: str, expected: bool) -> None:
    assert resolves(name) is expected


def test_no_code_carries_an_issue_number() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found


def module_docstring_lines() -> dict[str, int]:
    """Lines of each module's docstring; migrations left out (each describes a schema change)."""
    found = {}
    for path in sources():
        if "migrations" in path.parts:
            continue
        docstring = ast.get_docstring(parsed(path))
        found[path.relative_to(ROOT).as_posix()] = len(docstring.splitlines()) if docstring else 0
    return found


def test_module_docstrings_state_a_contract_in_a_few_lines() -> None:
    lines = module_docstring_lines()
    too_long = sorted(
        f"{module}: {count} lines"
        for module, count in lines.items()
        if count > MAX_MODULE_DOCSTRING_LINES and module not in LONG_MODULE_DOCSTRINGS
    )
    assert not too_long


def test_the_allow_list_of_long_docstrings_only_shrinks() -> None:
    lines = module_docstring_lines()
    # An entry whose module is gone or now short must leave the list.
    stale = sorted(
        module
        for module in LONG_MODULE_DOCSTRINGS
        if lines.get(module, 0) <= MAX_MODULE_DOCSTRING_LINES
    )
    assert not stale


def test_the_formatter_wins() -> None:
    """No code opts out of the formatter with its skip or off comment."""
    marker = re.compile("#" + r"\s*fmt:\s*(skip|off)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("metering", "workers", "tests", "bench")
        for path in sorted(ROOT.joinpath(folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if marker.search(line)
    ]
    assert not found


def test_no_renaming_import_aliases() -> None:
    """A thing has one name: an import keeps the name it was given (``X as X``,
    a re-export, is not a renaming). Migrations keep Alembic's ``sa``."""
    found = []
    for folder in ("metering", "workers"):
        for path in sorted(ROOT.joinpath(folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found += [
                        f"{path.relative_to(ROOT)}:{node.lineno} {alias.name} as {alias.asname}"
                        for alias in node.names
                        if alias.asname and alias.asname != alias.name.rsplit(".", 1)[-1]
                    ]
    assert found == []
