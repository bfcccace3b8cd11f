"""The layers contract (pyproject.toml, checked by `lint-imports`) names every
top-level module and package of `metering`, or each module of a package whose
modules sit on different floors, so a new one is placed on purpose; and the
top of `metering` holds few modules (docs/architecture.md: the rooms)."""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import metering

ROOT = Path(__file__).parent.parent
MAX_TOP_LEVEL_MODULES = 12


def layered() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [contract["layers"] for contract in contracts if contract["type"] == "layers"]
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer) if name.strip()}


def children(package: str, path: list[str]) -> list[tuple[str, bool]]:
    return [(f"{package}.{info.name}", info.ispkg) for info in pkgutil.iter_modules(path)]


def unplaced(named: set[str]) -> list[str]:
    """Top-level modules and packages of metering the layers do not place."""
    missing = []
    for name, is_package in children("metering", list(metering.__path__)):
        if name in named:
            continue
        path = [str(Path(metering.__path__[0]) / name.rpartition(".")[2])]
        inner = children(name, path) if is_package else []
        # A package split across floors: each of its modules is named instead.
        if not inner or any(module not in named for module, _ in inner):
            missing.append(name)
    return missing


def test_every_top_level_module_and_package_is_in_the_layers() -> None:
    assert unplaced(layered()) == []


def test_a_module_the_layers_do_not_name_is_found() -> None:
    named = layered()
    assert unplaced(named - {"metering.usage"}) == ["metering.usage"]
    assert unplaced(named - {"metering.pipeline.producer"}) == ["metering.pipeline"]


def test_the_top_of_metering_holds_few_modules() -> None:
    modules = [
        name for name, is_package in children("metering", list(metering.__path__)) if not is_package
    ]
    assert len(modules) + 1 <= MAX_TOP_LEVEL_MODULES, modules  # and __init__.py
