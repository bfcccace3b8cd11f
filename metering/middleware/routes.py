"""Per-route rules of a middleware."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    """A per-route rule: another limit or cost, or ``exempt`` from this middleware.

    ``path`` matches exactly, or as a prefix when it ends with ``*``;
    ``methods`` (upper case) restricts it. The first matching route wins.
    """

    path: str
    limit: str | None = None
    cost: int | None = None
    methods: frozenset[str] | None = None
    exempt: bool = False

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method.upper() not in self.methods:
            return False
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return path == self.path
