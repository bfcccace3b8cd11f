"""Per-route rules of a middleware, and the path they are matched against.

A client can spell one path many ways (``/IP/x``, ``//ip/x``, ``/a/../ip/x``,
``/%69p/x``), and servers pass most spellings on as they came. A route
that charges matches every spelling of its path: the path is normalised
(`canonical_path`) and compared without regard to case. An exempt route
matches only the path exactly as the application's router sees it, so an
odd spelling is never exempt: it is charged by the next rule that matches.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Final

_UNRESERVED: Final = frozenset(string.ascii_letters + string.digits + "-._~")
_PERCENT: Final = re.compile(r"%([0-9A-Fa-f]{2})")


def _decode_unreserved(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else match.group(0)


def canonical_path(path: str) -> str:
    """``path`` with unreserved characters percent-decoded (RFC 3986), repeated
    slashes collapsed and ``.``/``..`` segments resolved (never above ``/``).

    Case and a trailing slash are kept. A path already canonical, nearly
    every request, is returned as it is, without copying.
    """
    if "%" not in path and "//" not in path and "/." not in path:
        return path
    if "%" in path:
        path = _PERCENT.sub(_decode_unreserved, path)
    if not path.startswith("/"):
        return path
    parts = path.split("/")[1:]
    segments: list[str] = []
    for part in parts:
        if part == "..":
            if segments:
                segments.pop()
        elif part and part != ".":
            segments.append(part)
    trailing = "/" if segments and parts[-1] in ("", ".", "..") else ""
    return "/" + "/".join(segments) + trailing


@dataclass(frozen=True, slots=True)
class Route:
    """A per-route rule: another limit or cost, or ``exempt`` from this middleware.

    ``path`` matches exactly, or as a prefix when it ends with ``*``;
    ``methods`` (upper case) restricts it. The first matching route wins.
    A charging route matches any spelling of its path (case, ``//``, ``..``);
    an exempt one only the canonical path, case included (module docstring).
    """

    path: str
    limit: str | None = None
    cost: int | None = None
    methods: frozenset[str] | None = None
    exempt: bool = False
    _pattern: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefix = self.path.endswith("*")
        pattern = canonical_path(self.path[:-1] if prefix else self.path)
        # Matched against canonical paths: exempt ones as they are, others lower-cased.
        object.__setattr__(self, "_pattern", pattern if self.exempt else pattern.lower())

    def matches(self, method: str, path: str) -> bool:
        canonical = canonical_path(path)
        return self.matches_canonical(method, path, canonical, canonical.lower())

    def matches_canonical(self, method: str, path: str, canonical: str, folded: str) -> bool:
        """`matches`, given the request's path, its `canonical_path` and that lower-cased."""
        if self.methods is not None and method.upper() not in self.methods:
            return False
        if self.exempt:
            if path != canonical:
                return False
        else:
            path = folded
        if self.path.endswith("*"):
            return path.startswith(self._pattern)
        return path == self._pattern
