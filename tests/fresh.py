"""Run code in a fresh interpreter and see which packages it loaded.

The test process has loaded nearly everything already, so a claim that some
code leaves a package unloaded is checked in a new ``python -c``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable

_PROBE = (
    "\nimport sys as _sys\nprint(sorted({{m.split('.')[0] for m in _sys.modules}} & {among!r}))\n"
)


def run_fresh(code: str, among: Iterable[str]) -> tuple[list[str], list[str]]:
    """The lines ``code`` printed, and which of the top-level packages
    ``among`` were loaded when it ended (sorted); a failing run fails the test."""
    probe = code + _PROBE.format(among=set(among))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *printed, loaded = done.stdout.splitlines()
    return printed, ast.literal_eval(loaded)
