"""``metering demo``: the pipeline on the embedded default, no server.

It ends with what the product is for beyond decisions: a webhook the
worker delivered to a receiver on loopback (its signature verified as a
receiver would, with `metering.webhooks.verify`), and the month's overage
report, its chart written into the data directory.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from datetime import timedelta
from pathlib import Path
from typing import Final

import click
from rich.progress import Progress
from rich.text import Text

from metering.cli.context import data_directory
from metering.cli.output import counters_table, describe_limit
from metering.cli.reports import print_overage
from metering.cli.tables import console
from metering.demo import (
    DEMO_LIMITS,
    DemoFiles,
    ReceivedWebhook,
    WebhookReceiver,
    demo_events,
    emit_all,
    start_worker,
    stop_worker,
    wait_for_results,
)
from metering.errors import ConfigurationError, MeteringError, WebhookVerificationError
from metering.meter import Meter
from metering.reports.charts import DEFAULT_TOP, overage_chart
from metering.reports.overage import ReportRow, select_overage
from metering.webhooks import Webhooks, verify

# The webhook the demo waits for: the chatty visitor's first denial.
WEBHOOK_TYPE: Final = "limit.denied"
WEBHOOK_SUBJECT: Final = "visitor-1"


@click.command()
def demo() -> None:
    """Run the pipeline on the embedded default: worker, producer, results,
    a webhook and the month's overage report.

    Uses fresh files in METERING_HOME, default ./.metering (metering-demo.db,
    metering-demo-broker.db, the worker's log and the overage chart), and
    ignores --database. Needs no server: webhooks go to a receiver the demo
    runs on 127.0.0.1.
    """
    out = console()
    files = DemoFiles.fresh(data_directory())
    with Meter(files.database_url) as meter, WebhookReceiver() as receiver:
        meter.set_limits(DEMO_LIMITS)
        for limit in DEMO_LIMITS:
            out.print(Text(f"limit {describe_limit(limit)}"))
        _endpoint, secret = Webhooks(meter).add(receiver.url, types=[WEBHOOK_TYPE])
        click.echo(
            f"webhooks: {WEBHOOK_TYPE} to {receiver.url}, a receiver the demo runs "
            "(it checks signatures with metering.webhooks.verify)"
        )
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
            webhook = receiver.wait(_from_the_visitor, worker_process, files)
        finally:
            stop_worker(worker_process)
        out.print(counters_table(meter.counters(), title="counters after the demo"))
        tally = meter.outcome_counts()
        summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(tally.items()))
        click.echo(f"{len(events)} events, each with exactly one result: {summary}")
        click.echo(webhook_line(webhook, secret))
        month = meter.clock().strftime("%Y-%m")
        report = select_overage(meter, period=month, top=DEFAULT_TOP)
        shown = print_overage(report, DEFAULT_TOP)
        click.echo(chart_line(shown, files.chart, month))
    click.echo(f"data: {files.database} (results, counters), broker: {files.broker}")
    click.echo(f"worker log: {files.worker_log}")
    database = shlex.quote(files.database_url)
    click.echo(f"explore: {metering_command()} --database {database} result demo-0001")


def _message(webhook: ReceivedWebhook) -> dict[str, object]:
    try:
        document = json.loads(webhook.body)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _from_the_visitor(webhook: ReceivedWebhook) -> bool:
    data = _message(webhook).get("data")
    return isinstance(data, dict) and data.get("subject") == WEBHOOK_SUBJECT


def webhook_line(webhook: ReceivedWebhook, secret: str) -> str:
    """What the receiver got, and whether its signature is the endpoint's
    (`metering.webhooks.verify`, as a receiver checks it); `MeteringError` if not."""
    message = _message(webhook)
    data = message.get("data")
    about = ""
    if isinstance(data, dict):
        about = f" for {data.get('subject')} ({data.get('limit')})"
    try:
        verify(webhook.body, webhook.headers, secret)
    except WebhookVerificationError as exc:
        raise MeteringError(f"the demo's webhook failed verification: {exc}") from None
    return f"webhook {message.get('type')}{about} delivered by the worker: signature verified"


def chart_line(rows: list[ReportRow], path: Path, month: str) -> str:
    """Draw the overage chart of ``rows`` into ``path``; say where, or, without
    matplotlib (the optional ``charts`` extra), how to install it."""
    try:
        overage_chart(rows, path, month)
    except ConfigurationError:
        install = f"{_shown(Path(sys.executable))} -m pip install 'matplotlib>=3.8'"
        return f"chart: not drawn, matplotlib (the charts extra) is missing; install it: {install}"
    return f"chart of the overage report: {path}"


def metering_command() -> str:
    """``metering`` as it can be typed in this shell, in the working directory:
    ``metering`` when that name on PATH is this installation's command, else
    the path of this installation's command (relative to the working directory
    when it is inside it, as ``.venv/bin/metering``), else ``python -m metering``."""
    bindir = Path(os.path.abspath(sys.executable)).parent
    script = bindir / "metering"
    if script.is_file():
        found = shutil.which("metering")
        if found is not None and Path(found).resolve() == script.resolve():
            return "metering"
        return _shown(script)
    return f"{_shown(Path(os.path.abspath(sys.executable)))} -m metering"


def _shown(path: Path) -> str:
    """``path`` for a shell: relative when inside the working directory, quoted when needed."""
    here = Path.cwd()
    if path.is_absolute() and path.is_relative_to(here):
        text = str(path.relative_to(here))
        text = text if os.sep in text else f".{os.sep}{text}"
    else:
        text = str(path)
    return shlex.quote(text)
