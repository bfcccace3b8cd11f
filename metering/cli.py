"""The `metering` command line: limits, decisions, counters, schema, demo.

Errors are handled once, in `MeteringGroup`: every `MeteringError` and every
click usage error becomes one ``error: ...`` line on stderr and exit code 1.
Decisions exit 0 when allowed (or overage) and 2 when denied.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final, TypeVar

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url

from metering.config import broker_url, database_url, is_embedded_broker
from metering.domain.bounds import MAX_LISTING, validate_seconds
from metering.domain.decisions import ChargeDecision, Decision
from metering.domain.instants import as_utc, from_us
from metering.domain.limits import ALGORITHMS, ENFORCEMENTS, WINDOWS, Limit
from metering.errors import BrokerUnavailable, InvalidInput, MeteringError
from metering.meter import Counter, Meter
from metering.producer import UsageProducer, queue_names
from metering.reports.cli import report
from metering.storage.engine import SCHEMA_REVISION, normalise_url, upgrade_schema
from metering.webhooks.cli import webhooks

F = TypeVar("F", bound=Callable[..., Any])
ChargeTuple = tuple[str, str, int]

EXIT_DENIED: Final = 2
EXIT_CODES_HELP: Final = (
    "\b\nExit codes (scripts can branch on them):\n"
    "  0  allowed (or overage on a soft limit)\n  2  denied\n  1  error"
)
LABEL_COLOURS: Final = {"allowed": "green", "overage": "yellow", "fits": "cyan"}
MAX_ERROR_CHARS: Final = 400
MAX_QUEUES: Final = 1024
MAX_CONCURRENCY: Final = 4096
MAX_VISIBILITY_TIMEOUT_SECONDS: Final = 30 * 86_400


# -- errors: one line on stderr, exit 1, no traceback -------------------------


class CliError(click.ClickException):
    """An error shown as a single ``error: ...`` line."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        # One line, and a short one: click echoes a rejected value whole.
        text = " ".join(message.split())
        if len(text) > MAX_ERROR_CHARS:
            text = text[: MAX_ERROR_CHARS - 1] + "…"
        super().__init__(text)

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except CliError:
        raise
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        raise CliError(exc.format_message() + hint) from None
    except click.ClickException as exc:
        raise CliError(exc.format_message()) from None
    except MeteringError as exc:
        raise CliError(str(exc)) from None


class MeteringGroup(click.Group):
    """A group that turns `MeteringError` and usage errors into `CliError`."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors():
            return super().invoke(ctx)


# -- shared state and parameter types ---------------------------------------


@dataclass
class AppState:
    url: str
    meter: Meter | None = field(default=None, repr=False)


def _meter() -> Meter:
    """The command's `Meter`, opened on first use and closed with the context."""
    ctx = click.get_current_context()
    state = ctx.find_object(AppState)
    if state is None:
        raise CliError("no database configured")
    if state.meter is None:
        state.meter = ctx.find_root().with_resource(Meter(state.url))
    return state.meter


def _parse_at(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    """``--at``: an ISO-8601 datetime; naive means UTC."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO-8601 datetime like 2026-11-22T12:00:00Z"
        ) from None
    try:
        return as_utc(moment, field_name="at")
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


def _parse_seconds(maximum: float) -> Callable[[click.Context, click.Parameter, float], float]:
    """A callback for a number of seconds: finite, from 0 to ``maximum``."""

    def parse(_ctx: click.Context, param: click.Parameter, value: float) -> float:
        try:
            return validate_seconds(param.name or "seconds", value, maximum)
        except InvalidInput as exc:
            raise click.BadParameter(exc.message) from None

    return parse


def _parse_charges(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> list[ChargeTuple]:
    """``--charge SUBJECT:LIMIT:COST``, split from the right (a subject may contain ':')."""
    return [_parse_charge(value) for value in values]


def _parse_charge(value: str) -> ChargeTuple:
    parts = value.rsplit(":", 2)
    if len(parts) != 3:
        raise click.BadParameter(f"{value!r} is not SUBJECT:LIMIT:COST")
    try:
        cost = int(parts[2])
    except ValueError:
        raise click.BadParameter(f"cost {parts[2]!r} in {value!r} is not a whole number") from None
    return (parts[0], parts[1], cost)


def _format_option(func: F) -> F:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Human-readable output or JSON.",
    )(func)


# -- formatting ---------------------------------------------------------------


def _when(moment: datetime | None, *, ceil: bool = False) -> str:
    """``YYYY-MM-DD HH:MM:SS UTC``; ``ceil`` rounds up (never promise a time too early)."""
    if moment is None:
        return "-"
    moment = moment.astimezone(UTC)
    if ceil and moment.microsecond:
        moment = moment.replace(microsecond=0) + timedelta(seconds=1)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(text: str) -> str:
    return click.style(text, fg=LABEL_COLOURS.get(text.split()[0], "red"), bold=True)


def _charge_line(charge: ChargeDecision, label: str) -> str:
    line = f"{_label(label)}  {charge.subject} {charge.limit}  used {charge.used}/{charge.maximum}"
    resets = _when(charge.resets_at, ceil=True)
    if not charge.allowed and charge.retry_at is None:
        return f"{line}, cost {charge.cost} is more than the maximum: never fits"
    if not charge.allowed:
        return f"{line}, retry at {_when(charge.retry_at, ceil=True)}"
    if charge.overage:
        return f"{line}, {charge.overage} over, resets {resets}"
    return f"{line}, {charge.remaining} left, resets {resets}"


def _verdict_line(decision: Decision) -> str:
    if decision.outcome == "denied":
        line = f"{_label('denied by ' + ', '.join(decision.denied_by))}  nothing consumed"
        retry = decision.retry_at
        return line + (f", retry at {_when(retry, ceil=True)}" if retry else "")
    over = [c.limit for c in decision.charges if c.overage]
    note = f", over the maximum of {', '.join(over)}" if decision.outcome == "overage" else ""
    return f"{_label(decision.outcome)}  {len(decision.charges)} charges consumed{note}"


def _decision_lines(decision: Decision) -> list[str]:
    if decision.outcome == "rejected":
        lines = [f"{_label('rejected')}  event {decision.event_id}: {decision.reason}"]
    elif len(decision.charges) == 1:
        lines = [_charge_line(decision.charges[0], decision.outcome)]
    else:
        denied = decision.outcome == "denied"
        lines = [
            _charge_line(c, "fits" if denied and c.allowed else c.outcome) for c in decision.charges
        ]
        lines.append(_verdict_line(decision))
    if decision.duplicate:
        lines[-1] += "  (duplicate)"
    return lines


def _report(decision: Decision, fmt: str) -> None:
    """Print a decision and exit with its code: 0 allowed/overage, 2 denied/rejected."""
    if fmt == "json":
        click.echo(json.dumps({**decision.to_dict(), "duplicate": decision.duplicate}, indent=2))
    else:
        for line in _decision_lines(decision):
            click.echo(line)
    if not decision.allowed:
        click.get_current_context().exit(EXIT_DENIED)


def _describe(limit: Limit) -> str:
    parts = [f"{limit.name}: max {limit.maximum} per {limit.period}", limit.algorithm]
    if limit.algorithm == "fixed_window":
        parts.append(f"{limit.window} window")
    parts.append(limit.enforcement)
    if limit.thresholds:
        parts.append("thresholds " + "/".join(f"{t}%" for t in limit.thresholds))
    return ", ".join([*parts, f"lateness {limit.lateness}"])


def _console() -> Console:
    # Piped output is not squeezed into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 200)


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> Table:
    table = Table(title=title or None, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in NUMERIC_COLUMNS else "left")
    for row in rows:
        table.add_row(*(Text("-" if value is None else str(value)) for value in row))
    return table


NUMERIC_COLUMNS: Final = {"maximum", "used", "denied events", "denied cost"}
LIMIT_COLUMNS: Final = ("name", "maximum", "period", "algorithm", "window", "enforcement")
LIMIT_COLUMNS_MORE: Final = ("thresholds", "lateness")
COUNTER_COLUMNS: Final = ("subject", "limit", "window start", "window end", "used")
COUNTER_COLUMNS_MORE: Final = ("denied events", "denied cost", "first denial")


def _limit_row(limit: Limit) -> list[object]:
    window = limit.window if limit.algorithm == "fixed_window" else None
    thresholds = ", ".join(f"{t}%" for t in limit.thresholds) or None
    row: list[object] = [limit.name, limit.maximum, limit.period, limit.algorithm, window]
    return [*row, limit.enforcement, thresholds, limit.lateness]


def _counter_row(counter: Counter) -> list[object]:
    row: list[object] = [counter.subject, counter.limit]
    row += [_when(counter.window_start), _when(counter.window_end)]
    row += [counter.used, counter.denied_count, counter.denied_cost]
    return [*row, _when(counter.first_denied_at)]


def _counters_table(counters: Sequence[Counter], title: str = "") -> Table:
    columns = [*COUNTER_COLUMNS, *COUNTER_COLUMNS_MORE]
    return _table(columns, [_counter_row(c) for c in counters], title)


# -- commands -----------------------------------------------------------------


@click.group(cls=MeteringGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--database",
    metavar="URL",
    envvar="METERING_DATABASE_URL",
    show_envvar=True,
    help="Database URL (postgresql://... or sqlite:///file.db). Default: sqlite:///metering.db.",
)
@click.version_option(package_name="metering", prog_name="metering")
@click.pass_context
def main(ctx: click.Context, database: str | None) -> None:
    """Quota metering for consumption billing: limits, decisions and counters."""
    ctx.obj = AppState(database_url(database))


cli = main
main.add_command(report)


@main.group()
def limits() -> None:
    """Define, list, delete and load limits."""


@limits.command("set")
@click.argument("name")
@click.option("--max", "maximum", type=int, required=True, help="Inclusive maximum per period.")
@click.option("--period", required=True, help="30s, 2m, 1h, 1d, 7d, 1mo ...")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), help="Default: fixed_window.")
@click.option("--window", type=click.Choice(WINDOWS), help="Fixed window only. Default: first_use.")
@click.option("--enforcement", type=click.Choice(ENFORCEMENTS), help="Default: hard.")
@click.option("--threshold", "thresholds", type=int, multiple=True, help="Percent; repeatable.")
@click.option("--lateness", help="How late an event may arrive. Default: 1d.")
def limits_set(name: str, maximum: int, period: str, **options: Any) -> None:
    """Create or replace the limit NAME."""
    chosen = {key: value for key, value in options.items() if value not in (None, ())}
    click.echo(_describe(_meter().set_limit(Limit(name, maximum, period, **chosen))))


@limits.command("list")
@_format_option
def limits_list(fmt: str) -> None:
    """List the limits."""
    found = _meter().list_limits()
    if fmt == "json":
        click.echo(json.dumps([limit.to_dict() for limit in found], indent=2))
    elif not found:
        click.echo("no limits defined: add one with `metering limits set`")
    else:
        columns = [*LIMIT_COLUMNS, *LIMIT_COLUMNS_MORE]
        _console().print(_table(columns, [_limit_row(limit) for limit in found]))


@limits.command("delete")
@click.argument("name")
def limits_delete(name: str) -> None:
    """Delete the limit NAME (its counters are kept for reports)."""
    _meter().delete_limit(name)
    click.echo(f"deleted limit {name}")


@limits.command("load")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def limits_load(file: Path) -> None:
    """Load limits from a YAML or TOML FILE: all of them, or none."""
    loaded = _meter().load_limits(file)
    click.echo(f"loaded {len(loaded)} limit{'' if len(loaded) == 1 else 's'} from {file}")


def _decision_options(func: F) -> F:
    decorators = [
        click.argument("subject", required=False),
        click.argument("limit", required=False),
        click.option("--cost", type=int, help="Cost of SUBJECT LIMIT (default 1)."),
        click.option(
            "--charge",
            "charges",
            metavar="SUBJECT:LIMIT:COST",
            multiple=True,
            callback=_parse_charges,
            help="A charge of a stacked event (all or nothing); repeatable.",
        ),
        click.option(
            "--at",
            "occurred_at",
            metavar="ISO8601",
            callback=_parse_at,
            help="When the usage happened (default now); naive means UTC.",
        ),
        _format_option,
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _charges(
    subject: str | None, limit: str | None, cost: int | None, charges: Sequence[ChargeTuple]
) -> list[ChargeTuple]:
    if charges:
        if subject is not None or cost is not None:
            raise click.UsageError("give SUBJECT LIMIT [--cost N], or --charge, not both")
        return list(charges)
    if subject is None or limit is None:
        raise click.UsageError("give SUBJECT and LIMIT, or one or more --charge")
    return [(subject, limit, 1 if cost is None else cost)]


@main.command(epilog=EXIT_CODES_HELP)
@_decision_options
@click.option("--event-id", help="Idempotency key; a repeated id returns the stored result.")
def consume(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    occurred_at: datetime | None,
    fmt: str,
    event_id: str | None,
) -> None:
    """Decide and record a usage event: SUBJECT LIMIT, or several --charge."""
    wanted = _charges(subject, limit, cost, charges)
    decision = _meter().consume(charges=wanted, event_id=event_id, occurred_at=occurred_at)
    _report(decision, fmt)


@main.command(epilog=EXIT_CODES_HELP)
@_decision_options
def check(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    occurred_at: datetime | None,
    fmt: str,
) -> None:
    """What consume would decide now; consumes and records nothing."""
    wanted = _charges(subject, limit, cost, charges)
    _report(_meter().check(charges=wanted, occurred_at=occurred_at), fmt)


@main.command(epilog=EXIT_CODES_HELP.replace("  2  denied", "  2  denied or rejected"))
@click.argument("event_id")
@_format_option
def result(event_id: str, fmt: str) -> None:
    """Show the stored result of the event EVENT_ID."""
    found = _meter().result(event_id)
    if found is None:
        raise CliError(f"no result for event {event_id}")
    _report(found, fmt)


@main.command()
@click.option("--subject", help="Clear this subject's counters.")
@click.option("--limit", help="Clear this limit's counters.")
def reset(subject: str | None, limit: str | None) -> None:
    """Clear current counters of a subject and/or a limit (past windows stay)."""
    if subject is None and limit is None:
        raise click.UsageError("give --subject, --limit or both")
    cleared = _meter().reset(subject=subject, limit=limit)
    click.echo(f"cleared {cleared} counter{'' if cleared == 1 else 's'}")


@main.command()
@click.option("--subject", help="Only this subject.")
@click.option("--limit", help="Only this limit.")
@_format_option
def counters(subject: str | None, limit: str | None, fmt: str) -> None:
    """Show counters, every window, oldest first."""
    found = _meter().counters(subject=subject, limit=limit)
    if fmt == "json":
        click.echo(json.dumps([_counter_json(c) for c in found], indent=2))
    elif not found:
        click.echo("no counters")
    else:
        _console().print(_counters_table(found))


def _counter_json(counter: Counter) -> dict[str, Any]:
    fields = asdict(counter).items()
    return {key: v.isoformat() if isinstance(v, datetime) else v for key, v in fields}


@main.group()
def db() -> None:
    """Database schema."""


@db.command()
@click.pass_obj
def upgrade(state: AppState) -> None:
    """Create or migrate the schema to the current revision (SQLite or PostgreSQL)."""
    upgrade_schema(state.url)
    where = make_url(normalise_url(state.url)).render_as_string(hide_password=True)
    click.echo(f"schema at revision {SCHEMA_REVISION} ({where})")


# -- queue ------------------------------------------------------------------


@main.command(epilog="Prints the event id. The worker decides; see `metering result ID`.")
@_decision_options
@click.option("--event-id", help="Idempotency key; generated when not given.")
@click.option("--broker", envvar="METERING_BROKER_URL", help="Default: the embedded broker.")
def emit(
    subject: str | None,
    limit: str | None,
    cost: int | None,
    charges: list[ChargeTuple],
    occurred_at: datetime | None,
    fmt: str,
    event_id: str | None,
    broker: str | None,
) -> None:
    """Queue one usage event for the workers (does not wait for the decision)."""
    wanted = _charges(subject, limit, cost, charges)
    # This process ends here: an event the broker did not take is dropped
    # and reported, never sent later behind the user's back.
    logging.getLogger("metering.producer").setLevel(logging.ERROR)
    producer = UsageProducer(broker, retry_attempts=3)
    try:
        sent = producer.emit(charges=wanted, event_id=event_id, occurred_at=occurred_at)
        producer.flush()
    except BrokerUnavailable as exc:
        producer.discard()
        raise BrokerUnavailable(f"the event was not queued: {exc.reason}") from None
    finally:
        producer.close()
    click.echo(json.dumps({"event_id": sent}) if fmt == "json" else sent)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--concurrency", type=click.IntRange(1, MAX_CONCURRENCY),
              help="Worker processes (default: one per core).")  # fmt: skip
@click.option("--queues", type=click.IntRange(1, MAX_QUEUES), default=1,
              help="Consume metering.0 … metering.N-1.")  # fmt: skip
@click.option("--beat/--no-beat", default=None, help="Run the periodic sweeps in this worker.")
@click.option("--loglevel", default="INFO", help="DEBUG, INFO, WARNING ...")
@click.option("--broker", envvar="METERING_BROKER_URL", help="Default: the embedded broker.")
@click.pass_context
def worker(
    ctx: click.Context,
    concurrency: int | None,
    queues: int,
    beat: bool | None,
    loglevel: str,
    broker: str | None,
) -> None:
    """Apply queued events (runs `celery -A workers worker`; extra options go to celery).

    With the embedded broker the worker runs one process and the periodic
    sweeps by default; with Redis, run `celery -A workers beat` once beside
    any number of workers.
    """
    state = ctx.find_object(AppState)
    url = broker_url(broker)
    embedded = is_embedded_broker(url)
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--loglevel", loglevel]
    command += ["--queues", ",".join(queue_names(queues))]
    if embedded:
        command += ["--pool", "solo"]
    elif concurrency:
        command += ["--concurrency", str(concurrency)]
    if beat or (beat is None and embedded):
        command += ["--beat", "--schedule", str(Path.cwd() / ".metering-beat-schedule")]
    env = dict(os.environ, METERING_BROKER_URL=url, METERING_QUEUES=str(queues))
    if state is not None:
        env["METERING_DATABASE_URL"] = state.url
    os.execve(sys.executable, [*command, *ctx.args], env)


@main.command()
@click.option("--last", type=click.IntRange(1, MAX_LISTING), default=20, show_default=True,
              help="How many to show.")  # fmt: skip
@_format_option
def rejected(last: int, fmt: str) -> None:
    """Show queued input that could not be applied (malformed, conflicting ids)."""
    rows = _meter().rejected_messages(last)
    if fmt == "json":
        keys = ("event_id", "reason", "raw")
        click.echo(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
    elif not rows:
        click.echo("no rejected messages")
    else:
        _console().print(_table(["event id", "reason", "input"], [list(r) for r in rows]))


@main.command()
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option(
    "--visibility-timeout",
    type=float,
    envvar="METERING_VISIBILITY_TIMEOUT",
    default=300.0,
    show_default=True,
    callback=_parse_seconds(MAX_VISIBILITY_TIMEOUT_SECONDS),
    help="The broker's visibility timeout, seconds: part of the redelivery horizon.",
)
@_format_option
def prune(dry_run: bool, visibility_timeout: float, fmt: str) -> None:
    """Delete results, dead letters and webhook records past their retention.

    Ages come from METERING_RETAIN_RESULTS_DAYS (400), METERING_RETAIN_REJECTED_DAYS
    (90) and METERING_RETAIN_WEBHOOKS_DAYS (30); `never` keeps a table. A
    result is kept at least as long as its event could be delivered again.
    """
    from metering.retention import RetentionPolicy
    from metering.retention import prune as prune_tables

    done = prune_tables(
        _meter(),
        RetentionPolicy.from_environment(),
        visibility_timeout_seconds=visibility_timeout,
        dry_run=dry_run,
    )
    rows = [{"table": p.table, "older_than": _iso_us(p.before_us), "rows": p.rows} for p in done]
    if fmt == "json":
        click.echo(json.dumps({"dry_run": dry_run, "tables": rows}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    table = [[r["table"], r["older_than"], str(r["rows"])] for r in rows]
    _console().print(_table(["table", "older than", verb], table))


def _iso_us(at_us: int) -> str:
    return from_us(at_us).isoformat(timespec="seconds")


# -- demo ---------------------------------------------------------------------


@main.command()
def demo() -> None:
    """Run the pipeline on the embedded default: worker, producer, results.

    Uses fresh files in the working directory (metering-demo.db and
    metering-demo-broker.db) and ignores --database. Needs no server.
    """
    from metering import demo as demo_module

    console = _console()
    files = demo_module.DemoFiles.fresh(Path.cwd())
    with Meter(files.database_url) as meter:
        meter.set_limits(demo_module.DEMO_LIMITS)
        for limit in demo_module.DEMO_LIMITS:
            console.print(Text(f"limit {_describe(limit)}"))
        events = demo_module.demo_events(meter.clock() - timedelta(minutes=3))
        worker_process = demo_module.start_worker(files)
        try:
            console.print(
                f"worker started (pid {worker_process.pid}); emitting {len(events)} events"
            )
            demo_module.emit_all(files, events)
            with Progress(console=console) as progress:
                task = progress.add_task("results from the worker", total=len(events))
                demo_module.wait_for_results(
                    meter,
                    len(events),
                    worker_process,
                    files,
                    lambda done: progress.update(task, completed=done),
                )
        finally:
            demo_module.stop_worker(worker_process)
        console.print(_counters_table(meter.counters(), title="counters after the demo"))
        tally = meter.outcome_counts()
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(tally.items()))
    click.echo(f"{len(events)} events, each with exactly one result: {summary}")
    click.echo(f"data: {files.database} (results, counters), broker: {files.broker}")
    click.echo(f"worker log: {files.worker_log}")
    click.echo(f"explore: metering --database {files.database_url} result demo-0001")


main.add_command(webhooks)


# Defined in their own module, which imports the helpers above.
from metering.reservation_cli import reservations, reserve  # noqa: E402

main.add_command(reserve)
main.add_command(reservations)
