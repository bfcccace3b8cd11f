"""import-linter's layers contract, with "the rest of a package" as a layer.

`lint-imports` loads this module (``contract_types`` in pyproject.toml;
it puts the working directory on the path, so run it from the repository's
root, as `make lint` does). A layer may name ``PACKAGE.*``: every child of
``PACKAGE`` (module or sub-package) that no other layer names, contains or
lies in. So the services floor is written ``metering.meter : metering.*``,
and a new top-level module of `metering` lands on it without an edit to the
contract: it may import the floors below, and nothing above may be imported
by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from importlinter.contracts.layers import Layer, LayersContract, ModuleTail
from importlinter.domain.contract import ContractCheck

REST = ".*"


def _related(name: str, other: str) -> bool:
    """Whether one of two module names is the other or contains it."""
    return name == other or name.startswith(other + ".") or other.startswith(name + ".")


def expand(layers: Sequence[Layer], children: Any) -> list[Layer]:
    """``layers`` with each ``PACKAGE.*`` replaced by the children of
    ``PACKAGE`` (``children(PACKAGE)``) that no other layer names."""
    named = {
        tail.name for layer in layers for tail in layer.module_tails if not tail.name.endswith(REST)
    }
    expanded = []
    for layer in layers:
        tails: set[ModuleTail] = set()
        for tail in layer.module_tails:
            if not tail.name.endswith(REST):
                tails.add(tail)
                continue
            rest: Iterable[str] = children(tail.name[: -len(REST)])
            tails.update(
                ModuleTail(child)
                for child in sorted(rest)
                if not any(_related(child, other) for other in named)
            )
        expanded.append(Layer(tails, is_independent=layer.is_independent))
    return expanded


class PackageLayersContract(LayersContract):
    """``layers``, where a layer may hold ``PACKAGE.*`` (see the module)."""

    type_name = "package_layers"

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        self.layers = expand(self.layers, graph.find_children)  # type: ignore[has-type]
        return super().check(graph, verbose)
