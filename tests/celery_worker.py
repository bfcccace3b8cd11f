"""``celery -A workers worker ARGS`` without celery's umbrella command.

``WORKER`` is the command line of a real Celery worker of the ``workers``
app: celery's own ``worker`` command (every option, default and callback
as ``celery worker`` parses them) run directly, with the context the
umbrella command would give it. The umbrella imports every other
subcommand first (the REPL's prompt_toolkit, Pygments, the plugins' entry
points), CPU every worker process the tests start would spend for nothing.
Only the worker's own options are accepted, not celery's global ones
(``-A``, ``--broker``, ...); ``NO_COLOR`` is read as the umbrella reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path

WORKER = [sys.executable, str(Path(__file__).resolve())]


def main() -> None:
    """Run celery's ``worker`` command on ``sys.argv[1:]`` (exits with its status)."""
    import os

    import click

    # As `python -m celery`: the working directory first on the path, not tests/.
    sys.path[0] = os.getcwd()
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    from workers import app

    # The umbrella's --no-color (envvar NO_COLOR) and --quiet, neither given.
    no_color = bool(os.environ.get("NO_COLOR")) and click.BOOL.convert(
        os.environ["NO_COLOR"], None, None
    )
    worker.params.extend(app.user_options.get("worker", []))
    assert not app.user_options.get("preload"), "preload options need celery's umbrella command"
    context = CLIContext(app=app, no_color=no_color, workdir=None, quiet=False)
    worker.main(
        args=sys.argv[1:],
        prog_name="celery worker",
        obj=context,
        auto_envvar_prefix="CELERY_WORKER",
    )


if __name__ == "__main__":
    main()
