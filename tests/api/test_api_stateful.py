"""schemathesis as a client would run it: its CLI, every phase (stateful
included), against a real ``metering serve`` on SQLite and on PostgreSQL.

Each run uses an admin key, so every route is reachable, and the
``not_a_server_error`` check: a 5xx, or a connection the server drops, fails
the suite. One run per database: SQLite's with a fixed seed (the same cases
every time), PostgreSQL's with a random seed, printed so that a failure can
be replayed: ``st run URL --seed N ...`` with the arguments in the failure
message. (Both seeds on both databases were four runs and a fifth of the
API, storage and reports tests' time: `make test` is to stay under 10
minutes.) The coverage phase, every boundary and invalid value the schema
defines whatever the budget, is two thirds of a run: outside ``make
test-thorough`` only SQLite's run has it; PostgreSQL's runs the others.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from budgets import THOROUGH, cases, profile
from loopback import wait_until_serving
from servers import free_port

FIXED_SEED = 20261126
START_TIMEOUT_SECONDS = 60.0
RUN_TIMEOUT_SECONDS = 600
EXAMPLES = cases(10)
SEEDS = {"sqlite": FIXED_SEED, "postgresql": random.SystemRandom().randrange(2**31)}
ALL_PHASES = "examples,coverage,fuzzing,stateful"
PHASES = {
    "sqlite": ALL_PHASES,
    "postgresql": ALL_PHASES if profile() == THOROUGH else "examples,fuzzing,stateful",
}


def _metering(*args: str, cwd: Path, env: dict[str, str]) -> str:
    """``metering ARGS`` in ``cwd`` with ``env``, in this process (click's
    CliRunner: the setup needs no process of its own, the server does)."""
    from click.testing import CliRunner

    from metering.cli import main

    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        done = CliRunner().invoke(main, list(args), env={**unset, **env})
    finally:
        os.chdir(previous)
    assert done.exit_code == 0, done.output
    return done.stdout


@pytest.fixture(params=["sqlite", "postgresql"])
def environment(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    # The API's own per-key rate would answer most cases 429 otherwise.
    env["METERING_API_RATE"] = "1000000/1m"
    if request.param == "postgresql":
        env["METERING_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["METERING_BROKER_URL"] = request.getfixturevalue("redis_url")
    else:
        request.getfixturevalue("sqlite_url")  # ./metering.db in tmp_path, migrated
    return env


@pytest.fixture
def served(environment: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A running ``metering serve`` with two limits; (base URL, admin key)."""
    env = environment
    _metering("limits", "set", "api_calls", "--max", "50", "--period", "1h", cwd=tmp_path, env=env)
    _metering(
        "limits",
        "set",
        "org_calls",
        "--max",
        "20",
        "--period",
        "1m",
        "--algorithm",
        "token_bucket",
        cwd=tmp_path,
        env=env,
    )
    key = _metering("apikeys", "create", "--scope", "admin", cwd=tmp_path, env=env).split()[-1]
    port = free_port()
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "metering", "serve", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(process, base, log_path, START_TIMEOUT_SECONDS)
            yield base, key
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@pytest.mark.slow
def test_no_sequence_of_requests_gets_a_server_error(
    served: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    base, key = served
    database = request.node.callspec.params["environment"]
    seed = SEEDS[database]
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis' st is installed with the dev extra"
    # Hypothesis's tables of Unicode categories and of what a codec encodes
    # are kept in its storage directory, and computing them costs a run
    # about 3 s of CPU: st shares the suite's, not one in a new tmp_path.
    storage = Path(
        os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY") or request.config.rootpath / ".hypothesis"
    )
    arguments = [
        f"{base}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--phases",
        PHASES[database],
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "-H",
        f"Authorization: Bearer {key}",
        # Its examples in memory: each run starts with none, as it did in a
        # storage directory of its own.
        "--generation-database",
        ":memory:",
    ]
    done = subprocess.run(
        [st, "run", *arguments],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", "HYPOTHESIS_STORAGE_DIRECTORY": str(storage)},
    )
    assert done.returncode == 0, f"st run {' '.join(arguments)}\n{done.stdout[-8000:]}"
    assert "Stateful" in done.stdout  # the stateful phase ran
