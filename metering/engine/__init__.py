"""Applying and checking events: the fast path, the reference engine, group
commit, and `Engine`, the one place that chooses between them."""

from metering.engine.core import Engine

__all__ = ["Engine"]
