"""Writes the bytecode of what the processes the tests start import.

pip installs the dependencies without it (``--no-compile``: compiling every
module of every package took about as long as the install itself, and the
suite imports a fifth of them). A module's bytecode is written when it is
first imported where writing is allowed: the collection of `make test`'s
`asserts` writes that of every module the tests import, and this that of the
commands the tests start (a Celery worker and its pool, ``metering`` and
each of its commands, uvicorn, schemathesis' ``st``), so their processes
start from bytecode even where PYTHONDONTWRITEBYTECODE is set
(docs/testing.md).
"""

from __future__ import annotations

import importlib
import sys

ENTRIES = [
    "workers",
    "workers.beat",
    "celery.__main__",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.beat",
    "celery.worker.consumer",
    "celery.worker.strategy",
    "celery.concurrency.prefork",
    "billiard.pool",
    "kombu.transport.redis",
    "kombu.transport.sqlalchemy",
    "metering.__main__",
    "metering.api",
    "uvicorn",
    "uvicorn.main",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "schemathesis.cli",
]


def main() -> None:
    if sys.dont_write_bytecode:
        raise SystemExit("scripts/bytecode.py: PYTHONDONTWRITEBYTECODE is set; nothing to write")
    from metering.cli import COMMANDS

    commands = sorted({target.partition(":")[0] for target in COMMANDS.values()})
    for name in [*ENTRIES, *commands]:
        importlib.import_module(name)


if __name__ == "__main__":
    main()
