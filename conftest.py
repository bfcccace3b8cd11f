"""Every code block of README.md and docs/*.md runs in the test suite (sybil).

* ``python`` blocks run as written, each document in a fresh working
  directory with no ``METERING_*`` variables: the embedded default.
* ``sh`` blocks run with bash (``-e -o pipefail``) in that directory, with
  this venv's ``metering`` first on ``PATH``; they must exit 0.
* ``console`` blocks are sessions: each ``$ command`` runs in one bash, and
  the lines under it, when there are any, must match what it printed
  (``...`` matches anything, as in doctest).
* ``metering`` in those blocks forks from a process that imported the
  CLI once (`tests/command_server.py`), the same command with the block's
  streams, directory and environment, without a second of imports each
  time; `serve`, `worker`, `status` and `demo` run as processes of their own.
* ``<!-- skip: next -->`` before a block leaves it out, for the few that need
  a server or install software (the quick start's two commands, compose).

``sh`` and ``console`` blocks start processes: a document with one gets
the ``server`` marker whole, so ``make test-fast`` leaves it out.

Blocks of other languages (``json``, ``yaml``, ``text`` ...) are data.
"""

from __future__ import annotations

import doctest
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).parent
BLOCK_TIMEOUT_SECONDS = 300
MARKER = "@@@metering-docs-command@@@"


def _command_directory() -> Path:
    """The directory of a ``metering`` that runs through `tests/command_server.py`,
    its server started on first use and stopped when pytest exits."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import command_server

    return command_server.shim_directory()


def _environment(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PATH"] = f"{_command_directory()}{os.pathsep}{path}"
    env["HOME"] = str(workdir)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    return env


def _run_bash(script: str, workdir: Path, *, strict: bool) -> subprocess.CompletedProcess[str]:
    options = ["-e", "-o", "pipefail"] if strict else []
    return subprocess.run(
        ["bash", *options, "-c", script],
        cwd=workdir,
        env=_environment(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT_SECONDS,
        check=False,
    )


def run_sh(example: Example) -> str | None:
    done = _run_bash(example.parsed, example.namespace["workdir"], strict=True)
    if done.returncode != 0:
        return f"exit {done.returncode}\n{done.stdout}"
    return None


def _session(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return [(command, "\n".join(lines).strip()) for command, lines in steps]


def run_console(example: Example) -> str | None:
    steps = _session(example.parsed)
    script = "\n".join(f"echo {MARKER}\n{command}" for command, _ in steps)
    done = _run_bash(script, example.namespace["workdir"], strict=False)
    outputs = done.stdout.split(MARKER + "\n")[1:]
    if len(outputs) != len(steps):
        return f"the session stopped early:\n{done.stdout}"
    for (command, want), got in zip(steps, outputs, strict=True):
        got = "\n".join(line.rstrip() for line in got.strip().splitlines())
        if want and not doctest._ellipsis_match(want, got):  # type: ignore[attr-defined]
            return f"$ {command}\nexpected:\n{want}\ngot:\n{got}"
    return None


def setup(namespace: dict[str, Any]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="metering-docs-"))
    namespace["workdir"] = workdir
    namespace["previous_cwd"] = Path.cwd()
    namespace["saved_env"] = {k: v for k, v in os.environ.items() if k.startswith("METERING_")}
    for key in namespace["saved_env"]:
        del os.environ[key]
    os.chdir(workdir)


def teardown(namespace: dict[str, Any]) -> None:
    os.chdir(namespace["previous_cwd"])
    os.environ.update(namespace["saved_env"])
    shutil.rmtree(namespace["workdir"], ignore_errors=True)


pytest_collect_file = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser("sh", run_sh),
        CodeBlockParser("console", run_console),
        SkipParser(),
    ],
    patterns=["README.md", "docs/*.md"],
    setup=setup,
    teardown=teardown,
).pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A ``sh`` or ``console`` block runs ``metering`` processes (workers,
    ``serve``), and the blocks of one document share its directory and a
    skip runs up to the next block: a document with such a block is marked
    ``server`` whole, with the tests that need one, so ``make test-fast``
    leaves it to ``make test`` (docs/testing.md)."""
    documents: dict[str, list[pytest.Item]] = {}
    for item in items:
        example = getattr(item, "example", None)
        if example is not None:
            documents.setdefault(str(item.path), []).append(item)
    for examples in documents.values():
        if any(
            getattr(item.example.region, "evaluator", None) in (run_sh, run_console)  # type: ignore[attr-defined]
            for item in examples
        ):
            for item in examples:
                item.add_marker(pytest.mark.server)
