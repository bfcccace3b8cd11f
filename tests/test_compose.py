"""Checks of the deployment files: docker-compose.yml, Dockerfile, .dockerignore,
and what the compose file mounts from deploy/ (Prometheus, Grafana's dashboard).

No Docker engine is needed: the files are parsed and their promises checked
(services, persistence, configuration, start order). When the ``docker
compose`` client plugin is installed, ``docker compose config`` validates the
file against the Compose specification too; that needs no engine either.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from metering.cli import main
from metering.settings import Settings
from metering.telemetry.metrics import LagCollector, Metrics, QueueLag, WebhookBacklog

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "metering.json"

APP_SERVICES = ("migrate", "worker", "beat", "api")
OBSERVABILITY = ("prometheus", "grafana")
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


def _command(name: str) -> click.Command:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    return command


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
    assert {"postgres", "redis", *APP_SERVICES, *OBSERVABILITY} <= set(services)


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
    status = _command("status")
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


# -- the api, Prometheus and Grafana ----------------------------------------


def test_api_service_runs_metering_serve(services: dict[str, dict[str, Any]]) -> None:
    api = services["api"]
    argv = _argv(api["command"])
    assert argv[:2] == ["metering", "serve"]
    params = _command("serve").make_context("serve", argv[2:]).params
    assert params["host"] == "0.0.0.0"  # reachable from Prometheus's container
    assert api["ports"] == [f"127.0.0.1:{params['port']}:{params['port']}"]
    deps = _depends_on(api)
    assert deps["migrate"] == "service_completed_successfully"
    assert deps["redis"] == deps["postgres"] == "service_healthy"
    assert api["restart"] == "unless-stopped"
    # Keys are asked for from the start: an empty database serves no open API.
    assert Settings.from_env(_environment(api)).api_auth == "required"


def test_workers_count_metrics_in_memory(services: dict[str, dict[str, Any]]) -> None:
    # The multiprocess files go under $TMPDIR (/tmp in the image).
    assert "/tmp" in services["worker"]["tmpfs"]


def test_prometheus_and_grafana_are_optional(services: dict[str, dict[str, Any]]) -> None:
    for name in OBSERVABILITY:
        assert services[name]["profiles"] == ["observability"], name
    always = [name for name in services if name not in OBSERVABILITY]
    assert not [name for name in always if services[name].get("profiles")]


def _bind_sources(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of the service's bind mounts of repository files."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts.append((source, target))
    return mounts


def test_files_the_compose_file_mounts_exist(services: dict[str, dict[str, Any]]) -> None:
    mounted = [mount for service in services.values() for mount in _bind_sources(service)]
    assert mounted
    for source, _ in mounted:
        assert (ROOT / source).exists(), source


def test_prometheus_scrapes_the_api_and_every_worker(services: dict[str, dict[str, Any]]) -> None:
    assert ("./deploy/prometheus.yml", "/etc/prometheus/prometheus.yml") in _bind_sources(
        services["prometheus"]
    )
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    serve = _command("serve").make_context("serve", _argv(services["api"]["command"])[2:])
    assert jobs["metering-api"]["static_configs"] == [{"targets": [f"api:{serve.params['port']}"]}]
    # Docker's DNS answers the service name with every replica's address.
    [workers] = jobs["metering-worker"]["dns_sd_configs"]
    assert workers["names"] == ["worker"] and workers["type"] == "A"
    assert str(workers["port"]) == _environment(services["worker"])["METERING_METRICS_PORT"]
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())


def test_grafana_is_provisioned_with_the_dashboard(services: dict[str, dict[str, Any]]) -> None:
    mounts = dict(_bind_sources(services["grafana"]))
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "metering.yml").read_text())[
        "providers"
    ]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert (ROOT / "deploy" / "grafana" / "dashboards" / DASHBOARD.name) == DASHBOARD
    dashboard = json.loads(DASHBOARD.read_text())
    sources = {
        target["datasource"]["uid"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }
    assert sources == {source["uid"]}


def _exposed_names() -> set[str]:
    """Every sample name metering.telemetry.metrics exposes, the lag gauges included."""
    families = list(Metrics().registry.collect())
    lag = LagCollector(
        lambda: QueueLag((("metering", 0, 0),), 0.0), lambda: WebhookBacklog(0, 0, 0.0), lambda: 0
    )
    families += list(lag.collect())
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    return {
        family.name + suffix for family in families for suffix in suffixes.get(family.type, ("",))
    }


def test_the_shipped_alerting_rules_are_loaded_and_name_only_metering_metrics(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = dict(_bind_sources(services["prometheus"]))
    target = mounts["./deploy/prometheus-rules.yml"]
    assert yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"] == [target]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus-rules.yml").read_text())
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    named = {
        name for rule in alerts.values() for name in re.findall(r"\bmetering_\w+", rule["expr"])
    }
    assert named <= _exposed_names(), sorted(named - _exposed_names())
    # Usage never billed: anything rejected (an unknown limit) pages someone.
    assert alerts["MeteringEventsRejected"]["expr"] == "metering_rejected_recent > 0"


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_queries_only_metrics_metering_defines() -> None:
    exposed = _exposed_names()
    named = {name for query in _queries() for name in re.findall(r"\bmetering_\w+", query)}
    assert named, "the dashboard has no query"
    assert named <= exposed, sorted(named - exposed)


def test_the_dashboard_shows_throughput_denials_lag_and_webhook_health() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    text = " ".join(_queries())
    for metric in (
        "metering_events_total",  # throughput
        "metering_denials_total",  # denials
        "metering_queue_depth",  # lag
        "metering_oldest_undecided_age_seconds",
        "metering_webhook_deliveries_total",  # webhook health
        "metering_webhook_backlog",
    ):
        assert metric in text, metric
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


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
