"""``metering status``: is everything that applies queued usage alive?

Each check gives one line. The database (reachable, schema at this release's
revision) and the broker (reachable) must always pass; the workers must be
alive unless ``--require`` says otherwise, and beat only when asked for, since
the embedded default runs beat inside ``metering worker``; more than one beat
alive is a warning (``beats``): each sends every periodic task. How workers are
found alive depends on the broker: Celery's ping on Redis; on the embedded
broker, which has no broadcast, the heartbeat each worker writes to the
database (`workers.heartbeat`). Beat answers no ping: its heartbeat is read
on both. Queue depths and the oldest queued event are reported, and fail
only past ``--max-age``. Anything rejected in the last day (events for an
unknown limit, malformed messages: `metering rejected`) is a warning.

Nothing here raises: an unreachable database or broker is a failed check,
and the command exits 1 with one ``unhealthy: ...`` line per failure on
stderr. Time comes from the clock `collect_status` is given.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import click
from kombu.utils.url import maybe_sanitize_url
from sqlalchemy.engine import make_url

from metering.cli.context import AppState
from metering.cli.options import format_option, parse_seconds
from metering.cli.output import when
from metering.cli.tables import print_table, table
from metering.clock import Clock, system_clock
from metering.domain.instants import from_us, to_us
from metering.errors import MeteringError
from metering.pipeline.producer import make_celery
from metering.pipeline.routing import MAX_QUEUES, worker_queues
from metering.settings import broker_url
from metering.storage.connections import normalise_url
from metering.storage.health import ALIVE_WITHIN_SECONDS, BEAT, WORKER, DatabaseProbe
from metering.storage.queue_state import (
    BrokerQueues,
    Oldest,
    QueueDepth,
    broker_kind,
    oldest_undecided,
    open_queues,
)
from metering.upkeep.dead_letters import RECENT_SECONDS

EXIT_HEALTHY: Final = 0
EXIT_UNHEALTHY: Final = 1
REQUIRABLE: Final = ("worker", "beat")
DEFAULT_TIMEOUT_SECONDS: Final = 2.0
MAX_TIMEOUT_SECONDS: Final = 60.0
MAX_AGE_SECONDS: Final = 365 * 86_400.0
MAX_REASON_CHARS: Final = 300
STATUS_HELP: Final = (
    "\b\nExit codes:\n  0  healthy: every required check passed\n"
    "  1  unhealthy: one 'unhealthy: CHECK: reason' line per failed check on stderr"
)
# Ask workers by name: a ping (Redis) or a heartbeat row (embedded).
PingWorkers = Callable[[str, float, str | None], list[str]]


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report. A failed check that is not ``required`` only warns."""

    name: str
    ok: bool
    detail: str
    required: bool = True

    @property
    def state(self) -> str:
        return "ok" if self.ok else "FAIL" if self.required else "warn"

    def to_dict(self) -> dict[str, Any]:
        state = self.state.lower()
        return {
            "check": self.name,
            "state": state,
            "required": self.required,
            "detail": self.detail,
        }


@dataclass
class StatusReport:
    """What `collect_status` found; `healthy` when every required check passed."""

    checked_at: datetime
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return all(check.ok or not check.required for check in self.checks)

    @property
    def reasons(self) -> list[str]:
        """One line per failed required check."""
        return [f"{c.name}: {c.detail}" for c in self.checks if c.required and not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checked_at": self.checked_at.isoformat(timespec="seconds"),
            **self.facts,
            "checks": [check.to_dict() for check in self.checks],
            "reasons": self.reasons,
        }


# -- helpers -----------------------------------------------------------------------------


def one_line(text: str) -> str:
    """``text`` on one line, and not too long."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 1] + "…"


def describe(exc: BaseException) -> str:
    """An error as one line: our errors by their message, others by type and message."""
    if isinstance(exc, MeteringError):
        return one_line(str(exc))
    return one_line(f"{type(exc).__name__}: {exc}")


def ago(seconds: float) -> str:
    """A duration as a person says it: ``4 s``, ``12 min``, ``3 h``, ``2 d``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:.0f} d"


def shown_database(url: str) -> str:
    try:
        return make_url(normalise_url(url)).render_as_string(hide_password=True)
    except Exception:
        return "(an invalid URL)"


def node_name(node: str | None) -> str | None:
    """``--node``, with ``%h`` as this host's name (as celery's ``-n`` has it)."""
    return None if node is None else node.replace("%h", socket.gethostname())


def ping_workers(url: str, timeout_seconds: float, node: str | None) -> list[str]:
    """Node names of the workers that answer Celery's ping within the timeout."""
    app = make_celery(url, name="metering-status")
    # A connection of our own, closed here: on Redis, closing reads the reply
    # to the last poll for answers. One left in the app's pool stays polling,
    # and a process forked later from this one hangs in kombu's after-fork
    # cleanup, reading a reply another child already took.
    try:
        with app.connection_for_write() as connection:
            replies = app.control.ping(
                destination=[node] if node else None,
                timeout=timeout_seconds,
                limit=1 if node else None,
                connection=connection,
            )
    finally:
        app.close()
    return sorted(name for reply in replies or [] for name in reply)


def parse_require(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> frozenset[str]:
    """``--require``: comma-separated names of `REQUIRABLE`, or ``none``; repeatable."""
    names = {part.strip() for value in values for part in value.split(",") if part.strip()}
    if "none" in names:
        if len(names) > 1:
            raise click.BadParameter("'none' cannot be combined with other checks")
        return frozenset()
    unknown = sorted(names - set(REQUIRABLE))
    if unknown:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown))}: choose from {', '.join(REQUIRABLE)} or none"
        )
    return frozenset(names)


# -- the checks ------------------------------------------------------------------------


def _database_check(probe: DatabaseProbe) -> tuple[Check, dict[str, Any]]:
    schema = probe.schema()
    facts = {"reachable": True, "revision": schema.revision, "head": schema.head}
    if not schema.exists:
        detail = f"no database file yet: the first command or worker creates it at {schema.head}"
        return Check("database", True, detail), facts
    if schema.at_head:
        return Check("database", True, f"reachable, schema at {schema.head} (head)"), facts
    found = "no schema" if schema.revision is None else f"schema {schema.revision}"
    if not schema.known:
        detail = f"{found} is newer than this release knows (head {schema.head})"
        return Check("database", False, detail), facts
    if schema.dialect == "sqlite":
        detail = f"{found}, head {schema.head}: SQLite upgrades itself on first use"
        return Check("database", True, detail), facts
    detail = f"{found}, head {schema.head}: run `metering db upgrade`"
    return Check("database", False, detail), facts


def _worker_check(
    kind: str,
    probe: DatabaseProbe | None,
    broker: BrokerQueues | None,
    url: str,
    *,
    now_us: int,
    node: str | None,
    timeout_seconds: float,
    required: bool,
    ping: PingWorkers,
) -> tuple[Check, dict[str, Any]]:
    wanted = f"worker {node}" if node else "a worker"
    if kind == "redis":
        facts: dict[str, Any] = {"method": "ping", "alive": []}
        if broker is None:
            return Check(
                "workers", False, "cannot ping: the broker is unreachable", required
            ), facts
        alive = ping(url, timeout_seconds, node)
        facts["alive"] = alive
        if not alive or (node and node not in alive):
            detail = f"no answer from {wanted} to a ping within {timeout_seconds:g} s (by ping)"
            return Check("workers", False, detail, required), facts
        detail = f"{len(alive)} answered a ping (by ping): {', '.join(alive)}"
        return Check("workers", True, detail, required), facts
    facts = {"method": "heartbeat", "alive": []}
    if probe is None:
        detail = "cannot read heartbeats: the database is unreachable (by heartbeat)"
        return Check("workers", False, detail, required), facts
    seen = probe.heartbeats(WORKER)
    limit_us = int(ALIVE_WITHIN_SECONDS * 1_000_000)
    alive = sorted(name for name, at in seen.items() if now_us - at <= limit_us)
    facts["alive"] = alive
    if alive and (node is None or node in alive):
        detail = (
            f"{len(alive)} alive, heartbeat within {ALIVE_WITHIN_SECONDS:g} s (by heartbeat): "
            + ", ".join(alive)
        )
        return Check("workers", True, detail, required), facts
    candidates = {name: at for name, at in seen.items() if node is None or name == node}
    if candidates:
        name, at = max(candidates.items(), key=lambda item: item[1])
        detail = (
            f"no heartbeat from {wanted} within {ALIVE_WITHIN_SECONDS:g} s: "
            f"{name} last {ago((now_us - at) / 1e6)} ago (by heartbeat)"
        )
    else:
        detail = f"no heartbeat from {wanted} ever (by heartbeat)"
    return Check("workers", False, detail, required), facts


def _beat_check(
    probe: DatabaseProbe | None, *, now_us: int, required: bool
) -> tuple[Check, dict[str, Any]]:
    facts: dict[str, Any] = {"method": "heartbeat", "name": None, "last_seen": None, "alive": []}
    if probe is None:
        detail = "cannot read its heartbeat: the database is unreachable"
        return Check("beat", False, detail, required), facts
    seen = probe.heartbeats(BEAT)
    if not seen:
        return Check("beat", False, "never seen: no heartbeat from beat yet", required), facts
    name, at = max(seen.items(), key=lambda item: item[1])
    limit_us = int(ALIVE_WITHIN_SECONDS * 1_000_000)
    alive = sorted(n for n, seen_us in seen.items() if now_us - seen_us <= limit_us)
    facts.update(name=name, last_seen=from_us(at).isoformat(timespec="seconds"), alive=alive)
    age = (now_us - at) / 1e6
    if age <= ALIVE_WITHIN_SECONDS:
        return Check("beat", True, f"{name} seen {ago(age)} ago (by heartbeat)", required), facts
    detail = f"{name} last seen {ago(age)} ago, at {when(from_us(at))} (by heartbeat)"
    return Check("beat", False, detail, required), facts


def _beats_check(alive: Sequence[str]) -> Check | None:
    """A warning when more than one beat is alive (each sends every periodic task)."""
    if len(alive) <= 1:
        return None
    detail = (
        f"{len(alive)} beats alive, one is enough (each sends every periodic task): "
        + ", ".join(alive)
    )
    return Check("beats", False, detail, required=False)


def _rejected_check(probe: DatabaseProbe | None, *, now_us: int) -> tuple[Check, int | None]:
    """A warning while anything was rejected in the last day (`RECENT_SECONDS`)."""
    if probe is None:
        return Check("rejected", False, "cannot tell: the database is unreachable", False), None
    found = probe.rejected_since(now_us - RECENT_SECONDS * 1_000_000)
    if not found:
        return Check("rejected", True, "none in the last day", False), 0
    detail = f"{found} rejected in the last day: see `metering rejected`"
    return Check("rejected", False, detail, False), found


def _oldest_check(
    oldest: Oldest, *, now_us: int, max_age_seconds: float | None
) -> tuple[Check, dict[str, Any] | None]:
    required = max_age_seconds is not None
    message = oldest.message
    if message is None or message.sent_at_us is None:
        if oldest.undated:
            detail = f"unknown: {oldest.undated} queued batches carry no send time"
            return Check("oldest event", True, detail, required), None
        return Check("oldest event", True, "none queued", required), None
    age = max(0.0, (now_us - message.sent_at_us) / 1e6)
    where = f"{message.queue}, {'unacked' if message.unacked else 'waiting'}"
    facts = {
        "age_seconds": round(age, 3),
        "sent_at": from_us(message.sent_at_us).isoformat(timespec="milliseconds"),
        "queue": message.queue,
        "unacked": message.unacked,
        "event_id": message.event_ids[0],
    }
    detail = f"{ago(age)} old, sent {when(from_us(message.sent_at_us))} ({where})"
    if max_age_seconds is not None and age > max_age_seconds:
        return Check("oldest event", False, f"{detail}: over {ago(max_age_seconds)}"), facts
    return Check("oldest event", True, detail, required), facts


def _connections_check(probe: DatabaseProbe) -> tuple[Check | None, dict[str, int] | None]:
    """PostgreSQL: connections in use, metering's among them, against the
    server's room (a warning when it has none left); nothing on SQLite."""
    counts = probe.connections()
    if counts is None:
        return None, None
    detail = (
        f"{counts.in_use} in use ({counts.metering} by metering) of max_connections "
        f"{counts.max} ({counts.reserved} for superusers): room for {max(counts.room, 0)} more"
    )
    facts = {"metering": counts.metering, "in_use": counts.in_use, "max": counts.max}
    return Check("connections", counts.room > 0, detail, required=False), facts


def collect_status(
    database_url: str,
    broker: str,
    *,
    clock: Clock,
    queues: Iterable[str],
    require: frozenset[str] = frozenset({"worker"}),
    node: str | None = None,
    max_age_seconds: float | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ping: PingWorkers = ping_workers,
) -> StatusReport:
    """Run every check; never raises for what it finds unreachable or broken."""
    now = clock()
    now_us = to_us(now, field_name="clock")
    report = StatusReport(now)
    kind = broker_kind(broker)
    report.facts["database"] = {"url": shown_database(database_url), "reachable": False}
    report.facts["broker"] = {"url": maybe_sanitize_url(broker), "kind": kind, "reachable": False}

    probe: DatabaseProbe | None = None
    try:
        probe = DatabaseProbe(database_url, connect_timeout_seconds=timeout_seconds)
        check, facts = _database_check(probe)
        report.facts["database"].update(facts)
        report.checks.append(check)
    except Exception as exc:  # unreachable, or not a database URL: a failed check
        report.checks.append(Check("database", False, describe(exc)))
        if probe is not None:
            probe.close()
        probe = None

    if probe is not None:
        try:
            counted, connections = _connections_check(probe)
        except Exception as exc:  # a server that hides pg_stat_activity: a warning
            counted, connections = Check("connections", False, describe(exc), False), None
        if counted is not None:
            report.checks.append(counted)
            report.facts["database"]["connections"] = connections

    names = list(queues)
    found: BrokerQueues | None = None
    try:
        found = open_queues(broker, timeout_seconds=timeout_seconds)
        names = sorted(set(names) | set(found.present_queues()), key=_queue_order)
        depths = found.depths(names)
        report.facts["broker"]["reachable"] = True
        report.checks.append(Check("broker", True, f"reachable ({kind})"))
        report.facts["queues"] = [_depth_dict(d) for d in depths]
        for depth in depths:
            detail = f"{depth.waiting} waiting, {depth.unacked} unacked"
            report.checks.append(Check(f"queue {depth.queue}", True, detail))
    except Exception as exc:
        report.checks.append(Check("broker", False, describe(exc)))
        report.facts["queues"] = []
        if found is not None:
            found.close()
        found = None

    try:
        try:
            check, facts = _worker_check(
                kind,
                probe,
                found,
                broker,
                now_us=now_us,
                node=node,
                timeout_seconds=timeout_seconds,
                required="worker" in require,
                ping=ping,
            )
        except Exception as exc:
            check = Check("workers", False, f"cannot tell: {describe(exc)}", "worker" in require)
            facts = {"method": "ping" if kind == "redis" else "heartbeat", "alive": []}
        report.checks.append(check)
        report.facts["workers"] = facts

        try:
            check, facts = _beat_check(probe, now_us=now_us, required="beat" in require)
        except Exception as exc:
            check = Check("beat", False, f"cannot tell: {describe(exc)}", "beat" in require)
            facts = {"method": "heartbeat", "name": None, "last_seen": None, "alive": []}
        report.checks.append(check)
        report.facts["beat"] = facts
        several = _beats_check(facts.get("alive", []))
        if several is not None:
            report.checks.append(several)

        try:
            check, count = _rejected_check(probe, now_us=now_us)
        except Exception as exc:
            check, count = Check("rejected", False, f"cannot tell: {describe(exc)}", False), None
        report.checks.append(check)
        report.facts["rejected_last_day"] = count

        report.facts["oldest_event"] = None
        if found is None:
            required = max_age_seconds is not None
            detail = "cannot tell: the broker is unreachable"
            report.checks.append(Check("oldest event", False, detail, required))
        else:
            try:
                decided = probe.decided if probe is not None else _nothing_decided
                oldest = oldest_undecided(found, names, decided)
                check, age_facts = _oldest_check(
                    oldest, now_us=now_us, max_age_seconds=max_age_seconds
                )
                report.facts["oldest_event"] = age_facts
            except Exception as exc:
                required = max_age_seconds is not None
                check = Check("oldest event", False, f"cannot tell: {describe(exc)}", required)
            report.checks.append(check)
    finally:
        if probe is not None:
            probe.close()
        if found is not None:
            found.close()
    return report


def _nothing_decided(_event_ids: Iterable[str]) -> set[str]:
    return set()


def _queue_order(name: str) -> tuple[int, str]:
    # metering first, then metering.0, metering.1 … by number.
    suffix = name.rpartition(".")[2]
    return (int(suffix) + 1 if suffix.isdigit() else 0, name)


def _depth_dict(depth: QueueDepth) -> dict[str, Any]:
    return {"queue": depth.queue, "waiting": depth.waiting, "unacked": depth.unacked}


# -- the command ---------------------------------------------------------------------


def print_report(report: StatusReport, fmt: str) -> None:
    """The report on stdout; the reasons it is unhealthy on stderr, one line each."""
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        verdict = "healthy" if report.healthy else "UNHEALTHY"
        title = f"metering status: {verdict} at {when(report.checked_at)}"
        rows = [[check.name, check.state, check.detail] for check in report.checks]
        print_table(table(["check", "state", "detail"], rows, title))
    sys.stdout.flush()
    for reason in report.reasons:
        click.echo(f"unhealthy: {reason}", err=True)


@click.command(epilog=STATUS_HELP)
@click.option("--broker", envvar="METERING_BROKER_URL", help="Default: the embedded broker.")
@click.option(
    "--queues",
    type=click.IntRange(1, MAX_QUEUES),
    envvar="METERING_QUEUES",
    default=1,
    show_default=True,
    help="Report metering.0 … metering.N-1 besides metering (as the workers "
    "consume them); queues found on the broker are reported too.",
)
@click.option(
    "--require",
    "required",
    multiple=True,
    default=("worker",),
    show_default=True,
    callback=parse_require,
    metavar="LIST",
    help="What must be alive for exit 0: worker, beat, worker,beat or none. "
    "The database and the broker always must be.",
)
@click.option(
    "--node",
    metavar="NAME",
    help="The worker that must be alive, as celery names it (celery@%h: "
    "%h is this host's name); default: any worker.",
)
@click.option(
    "--max-age",
    "max_age",
    type=float,
    callback=lambda ctx, param, value: (
        None if value is None else parse_seconds(MAX_AGE_SECONDS)(ctx, param, value)
    ),
    metavar="SECONDS",
    help="Unhealthy when the oldest queued event waits longer than this.",
)
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    callback=parse_seconds(MAX_TIMEOUT_SECONDS),
    metavar="SECONDS",
    help="How long to wait for the database, the broker and workers' answers.",
)
@format_option
@click.pass_context
def status(
    ctx: click.Context,
    broker: str | None,
    queues: int,
    required: frozenset[str],
    node: str | None,
    max_age: float | None,
    timeout: float,
    fmt: str,
) -> None:
    """Check the database, the broker, its queues, the workers and beat.

    Workers are found alive by Celery's ping on Redis, and by their heartbeat
    on the embedded broker; beat by its heartbeat (every 10 s; alive when seen
    within 30 s). The oldest event is the oldest still queued, waiting or taken
    by a worker and not yet decided.
    """
    state = ctx.find_object(AppState)
    database_url = state.url if state is not None else ""
    report = collect_status(
        database_url,
        broker_url(broker),
        clock=system_clock,
        queues=worker_queues(queues),
        require=required,
        node=node_name(node),
        max_age_seconds=max_age,
        timeout_seconds=timeout,
    )
    print_report(report, fmt)
    ctx.exit(EXIT_HEALTHY if report.healthy else EXIT_UNHEALTHY)
