"""``metering demo``: the pipeline on the embedded default, no server."""

from __future__ import annotations

from datetime import timedelta

import click
from rich.progress import Progress
from rich.text import Text

from metering.cli.context import data_directory
from metering.cli.output import console, counters_table, describe_limit
from metering.demo import (
    DEMO_LIMITS,
    DemoFiles,
    demo_events,
    emit_all,
    start_worker,
    stop_worker,
    wait_for_results,
)
from metering.meter import Meter


@click.command()
def demo() -> None:
    """Run the pipeline on the embedded default: worker, producer, results.

    Uses fresh files in METERING_HOME, default ./.metering (metering-demo.db,
    metering-demo-broker.db and the worker's log), and ignores --database.
    Needs no server.
    """
    out = console()
    files = DemoFiles.fresh(data_directory())
    with Meter(files.database_url) as meter:
        meter.set_limits(DEMO_LIMITS)
        for limit in DEMO_LIMITS:
            out.print(Text(f"limit {describe_limit(limit)}"))
        events = demo_events(meter.clock() - timedelta(minutes=3))
        worker_process = start_worker(files)
        try:
            out.print(f"worker started (pid {worker_process.pid}); emitting {len(events)} events")
            emit_all(files, events)
            with Progress(console=out) as progress:
                task = progress.add_task("results from the worker", total=len(events))
                wait_for_results(
                    meter,
                    len(events),
                    worker_process,
                    files,
                    lambda done: progress.update(task, completed=done),
                )
        finally:
            stop_worker(worker_process)
        out.print(counters_table(meter.counters(), title="counters after the demo"))
        tally = meter.outcome_counts()
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(tally.items()))
    click.echo(f"{len(events)} events, each with exactly one result: {summary}")
    click.echo(f"data: {files.database} (results, counters), broker: {files.broker}")
    click.echo(f"worker log: {files.worker_log}")
    click.echo(f"explore: metering --database {files.database_url} result demo-0001")
