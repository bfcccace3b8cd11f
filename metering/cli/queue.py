"""``metering emit|worker|rejected|prune``: the queue, its workers and its leftovers."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from typing import Final

import click

from metering.cli.context import AppState, SentenceGroup, current_meter, data_directory
from metering.cli.options import (
    EventOptions,
    decision_options,
    format_option,
    parse_seconds,
)
from metering.cli.output import iso_us
from metering.cli.tables import print_table, table
from metering.domain.bounds import MAX_LISTING
from metering.errors import BrokerUnavailable
from metering.meter import Meter
from metering.pipeline.producer import UsageProducer
from metering.pipeline.routing import MAX_QUEUES, worker_queues
from metering.pipeline.transport import is_embedded_broker
from metering.settings import RetentionPolicy, broker_url, child_environment
from metering.upkeep import retention

MAX_CONCURRENCY: Final = 4096
MAX_VISIBILITY_TIMEOUT_SECONDS: Final = 30 * 86_400


@click.command(epilog="Prints the event id. The worker decides; see `metering result ID`.")
@decision_options
@click.option("--event-id", help="Idempotency key; generated when not given.")
@click.option("--broker", envvar="METERING_BROKER_URL", help="Default: the embedded broker.")
def emit(event: EventOptions, event_id: str | None, broker: str | None) -> None:
    """Queue one usage event for the workers (does not wait for the decision)."""
    # This process ends here: an event the broker did not take is dropped
    # and reported, never sent later behind the user's back.
    logging.getLogger("metering.pipeline.producer").setLevel(logging.ERROR)
    # The database given to `metering` (else the producer's own default):
    # a charge to a limit it does not define is refused here.
    database = click.get_current_context().find_root().params.get("database")
    producer = UsageProducer(broker, retry_attempts=3, database_url=database)
    try:
        sent = producer.emit(
            charges=event.charges,
            event_id=event_id,
            occurred_at=event.occurred_at,
            metadata=event.metadata,
        )
        producer.flush()
    except BrokerUnavailable as exc:
        producer.discard()
        raise BrokerUnavailable(f"the event was not queued: {exc.reason}") from None
    finally:
        producer.close()
    click.echo(json.dumps({"event_id": sent}) if event.fmt == "json" else sent)


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_CONCURRENCY),
    help="Worker processes (default: one per core; embedded broker: one).",
)
@click.option(
    "--queues",
    type=click.IntRange(1, MAX_QUEUES),
    envvar="METERING_QUEUES",
    default=1,
    show_default=True,
    help="Also consume metering.0 … metering.N-1 (always metering itself).",
)
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
    any number of workers. Beat's schedule file goes in METERING_HOME
    (default ./.metering).
    """
    state = ctx.find_object(AppState)
    url = broker_url(broker)
    embedded = is_embedded_broker(url)
    if state is not None:
        # As `metering serve` does: a database that does not answer (or has an
        # outdated schema) is one error line and exit 1 now, not a worker
        # that starts and fails every task. Later outages are retried.
        Meter(state.url).close()
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--loglevel", loglevel]
    # The default queue always: beat, `metering emit` and one-queue producers use it.
    command += ["--queues", ",".join(worker_queues(queues))]
    if embedded:
        # One process: the banner says so (celery counted the cores otherwise).
        command += ["--pool", "solo", "--concurrency", "1"]
        if concurrency is not None and concurrency != 1:
            click.echo(
                "warning: the embedded broker runs one worker process: "
                f"--concurrency {concurrency} is ignored (use Redis for more)",
                err=True,
            )
    elif concurrency:
        command += ["--concurrency", str(concurrency)]
    if beat or (beat is None and embedded):
        command += ["--beat", "--schedule", str(data_directory() / "beat-schedule")]
    env = child_environment(METERING_BROKER_URL=url, METERING_QUEUES=str(queues))
    if state is not None:
        env["METERING_DATABASE_URL"] = state.url
    os.execve(sys.executable, [*command, *ctx.args], env)


@click.group(cls=SentenceGroup, invoke_without_command=True)
@click.option(
    "--last",
    type=click.IntRange(1, MAX_LISTING),
    default=20,
    show_default=True,
    help="How many to show.",
)
@format_option
@click.pass_context
def rejected(ctx: click.Context, last: int, fmt: str) -> None:
    """Show what the workers could not apply, newest first: rejected events
    (unknown limit, too late), malformed messages, reused ids.

    `metering rejected replay` applies the rejected events once they are
    acceptable (their limit defined since), each exactly once.
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = current_meter().rejected_messages(last)
    if fmt == "json":
        keys = ("event_id", "reason", "raw")
        click.echo(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
    elif not rows:
        click.echo("no rejected messages")
    else:
        print_table(table(["event id", "reason", "input"], [list(r) for r in rows]))


@rejected.command("replay")
@click.option(
    "--count",
    type=click.IntRange(1, MAX_LISTING),
    default=10_000,
    show_default=True,
    help="At most this many events, oldest first.",
)
@format_option
def replay(count: int, fmt: str) -> None:
    """Apply the rejected events that are acceptable now, each exactly once.

    An event already decided stays one result: its `rejected` result is
    replaced by the decision, in one transaction. Events still unacceptable
    (the limit still unknown, too late) stay listed, with why.
    """
    done = current_meter().replay_rejected(count)
    if fmt == "json":
        applied = [{**d.to_dict(), "duplicate": False} for d in done.applied]
        waiting = [{"event_id": e, "reason": r} for e, r in done.waiting]
        click.echo(json.dumps({"applied": applied, "still_rejected": waiting}, indent=2))
        return
    outcomes = Counter(d.outcome for d in done.applied)
    shown = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
    noun = "event" if len(done.applied) == 1 else "events"
    counts = f" ({shown})" if shown else ""
    click.echo(f"replayed {len(done.applied)} {noun}{counts}; {len(done.waiting)} still rejected")
    if done.waiting:
        print_table(table(["event id", "still rejected because"], [list(w) for w in done.waiting]))


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option(
    "--visibility-timeout",
    type=float,
    envvar="METERING_VISIBILITY_TIMEOUT",
    default=300.0,
    show_default=True,
    callback=parse_seconds(MAX_VISIBILITY_TIMEOUT_SECONDS),
    help="The broker's visibility timeout, seconds: part of the redelivery horizon.",
)
@format_option
def prune(dry_run: bool, visibility_timeout: float, fmt: str) -> None:
    """Delete results, dead letters and webhook records past their retention.

    Ages come from METERING_RETAIN_RESULTS_DAYS (400), METERING_RETAIN_REJECTED_DAYS
    (90) and METERING_RETAIN_WEBHOOKS_DAYS (30); `never` keeps a table. A
    result is kept at least as long as its event could be delivered again.
    """
    done = retention.prune(
        current_meter(),
        RetentionPolicy.from_environment(),
        visibility_timeout_seconds=visibility_timeout,
        dry_run=dry_run,
    )
    rows = [{"table": p.table, "older_than": iso_us(p.before_us), "rows": p.rows} for p in done]
    if fmt == "json":
        click.echo(json.dumps({"dry_run": dry_run, "tables": rows}, indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    shown = [[r["table"], r["older_than"], str(r["rows"])] for r in rows]
    print_table(table(["table", "older than", verb], shown))
