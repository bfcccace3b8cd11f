"""Checks of the deployment files: docker-compose.yml, Dockerfile, .dockerignore.

No Docker engine is needed: the files are parsed and their promises checked
(services, persistence, configuration, start order). When the ``docker
compose`` client plugin is installed, ``docker compose config`` validates the
file against the Compose specification too; that needs no engine either.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from metering.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

APP_SERVICES = ("migrate", "worker", "beat")
DATABASE_URL = "postgresql://metering:metering@postgres:5432/metering"
BROKER_URL = "redis://redis:6379/0"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


def _argv(command: str | list[str]) -> list[str]:
    """A service's command as a list, whichever form the file uses."""
    return command.split() if isinstance(command, str) else [str(arg) for arg in command]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict (Compose allows a map or KEY=VALUE list)."""
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency name -> condition (the short list form means service_started)."""
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _healthcheck_command(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def _named_volumes(compose: dict[str, Any], service: dict[str, Any]) -> list[str]:
    """Sources of the service's volumes that are top-level named volumes."""
    declared = compose.get("volumes") or {}
    names = []
    for volume in service.get("volumes", []):
        source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source")
        if source in declared:
            names.append(source)
    return names


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, "Dockerfile ends in a line continuation"
    return instructions


# -- docker-compose.yml ------------------------------------------------------


def test_all_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert {"postgres", "redis", "migrate", "worker", "beat"} <= set(services)


def test_postgres_service(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:15"
    env = _environment(postgres)
    assert env["POSTGRES_USER"] == env["POSTGRES_PASSWORD"] == env["POSTGRES_DB"] == "metering"
    assert "pg_isready" in _healthcheck_command(postgres)
    assert _named_volumes(compose, postgres), "PostgreSQL data must live in a named volume"


def test_redis_service_persists_with_appendonly(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    redis = services["redis"]
    assert redis["image"] == "redis:7"
    argv = _argv(redis["command"])
    assert argv[0] == "redis-server"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"
    assert "redis-cli ping" in _healthcheck_command(redis)
    assert _named_volumes(compose, redis), "Redis data must live in a named volume"


def test_no_server_port_is_published(services: dict[str, dict[str, Any]]) -> None:
    for name in ("postgres", "redis"):
        assert "ports" not in services[name], f"{name} must be reachable only inside the stack"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_are_built_from_the_dockerfile(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    build = services[name]["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (ROOT / context).resolve() == ROOT
    assert (ROOT / context / dockerfile).resolve() == DOCKERFILE


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_get_database_and_broker_urls(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    env = _environment(services[name])
    assert env["METERING_DATABASE_URL"] == DATABASE_URL
    assert env["METERING_BROKER_URL"] == BROKER_URL


def test_app_services_share_one_environment(services: dict[str, dict[str, Any]]) -> None:
    environments = [_environment(services[name]) for name in APP_SERVICES]
    assert all(env == environments[0] for env in environments)


def test_migrate_runs_db_upgrade_once(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert _argv(migrate["command"]) == ["metering", "db", "upgrade"]
    assert _depends_on(migrate)["postgres"] == "service_healthy"
    # Quoted in the file: a bare `no` is YAML 1.1 for False.
    assert migrate["restart"] == "no"


def test_worker_waits_for_migration_and_broker(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert _argv(worker["command"])[:2] == ["metering", "worker"]
    deps = _depends_on(worker)
    assert deps["migrate"] == "service_completed_successfully"
    assert deps["redis"] == "service_healthy"
    assert worker["restart"] == "unless-stopped"
    assert worker["stop_grace_period"] == "30s"


def test_beat_runs_celery_beat(services: dict[str, dict[str, Any]]) -> None:
    beat = services["beat"]
    assert _argv(beat["command"]) == ["celery", "-A", "workers", "beat", "--loglevel", "INFO"]
    assert _depends_on(beat)["redis"] == "service_healthy"
    # Two schedulers would run every sweep twice.
    assert beat.get("deploy", {}).get("replicas", 1) == 1


@pytest.mark.parametrize(("name", "required"), [("worker", "worker"), ("beat", "beat")])
def test_worker_and_beat_are_checked_by_metering_status(
    services: dict[str, dict[str, Any]], name: str, required: str
) -> None:
    healthcheck = services[name]["healthcheck"]
    test = healthcheck["test"]
    assert isinstance(test, list) and test[0] == "CMD", "exec form: no shell in the way"
    argv = test[1:]
    assert argv[:2] == ["metering", "status"]
    assert argv[argv.index("--require") + 1] == required
    # The command takes these options as written (parsing them runs no check).
    status = main.commands["status"]
    parsed = status.make_context("status", argv[2:]).params
    assert parsed["required"] == frozenset({required})
    # A check runs a ping (2 s at most) after reaching the database and broker.
    assert _seconds(healthcheck["timeout"]) >= 10
    assert _seconds(healthcheck["interval"]) >= _seconds(healthcheck["timeout"])
    assert healthcheck["retries"] >= 2


def test_each_worker_checks_its_own_node(services: dict[str, dict[str, Any]]) -> None:
    argv = services["worker"]["healthcheck"]["test"][1:]
    # `metering worker` runs celery's default node name, celery@ the hostname.
    assert argv[argv.index("--node") + 1] == "celery@%h"


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in sorted(units, key=len, reverse=True):
        if duration.endswith(suffix):
            return float(duration[: -len(suffix)]) * units[suffix]
    raise AssertionError(f"not a compose duration: {duration!r}")


def test_compose_file_validates_with_docker_compose() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker client not installed")
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- Dockerfile and .dockerignore --------------------------------------------


def test_dockerfile_builds_a_non_root_image_of_the_package() -> None:
    assert DOCKERFILE.is_file()
    instructions = _dockerfile_instructions()
    keywords = [keyword for keyword, _ in instructions]
    last = dict(instructions)  # the last of each instruction

    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert last["WORKDIR"] == "/app"
    installs = [
        i
        for i, (keyword, arg) in enumerate(instructions)
        if keyword == "RUN" and "pip install --no-cache-dir ." in arg.split("&&")[0]
    ]
    assert installs, "no `RUN pip install --no-cache-dir .`"
    assert "COPY" in keywords[: installs[0]], "the project is copied before it is installed"

    assert "USER" in last
    assert last["USER"] not in ("root", "0")
    last_run = max(i for i, keyword in enumerate(keywords) if keyword == "RUN")
    assert keywords.index("USER") > last_run, "switch to the unprivileged user last"
    assert json.loads(last["CMD"]) == ["metering", "worker"]


def test_dockerignore_keeps_local_state_out_but_not_the_package() -> None:
    assert DOCKERIGNORE.is_file()
    patterns = {
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "*.db"} <= patterns
    assert any("__pycache__" in pattern for pattern in patterns)
    assert any("cache" in pattern and pattern != "**/__pycache__" for pattern in patterns)
    copied = {"pyproject.toml", "README.md", "metering", "workers"}
    assert not copied & patterns, "the Dockerfile copies these"
