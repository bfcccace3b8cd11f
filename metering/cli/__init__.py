"""The `metering` command line, assembled from one module per command group.

Errors are handled once, by the root group (`metering.cli.context`): every
`MeteringError` and every click usage error becomes one ``error: ...`` line
on stderr and exit code 1. Decisions exit 0 when allowed (or overage) and 2
when denied.
"""

from __future__ import annotations

import click

from metering.cli.alerts import alerts
from metering.cli.apikeys import apikeys
from metering.cli.context import AppState, MeteringGroup, database_option
from metering.cli.db import db
from metering.cli.demo import demo
from metering.cli.entitlements import entitlements
from metering.cli.events import check, consume, counters, reset, result, seats
from metering.cli.grants import corrections, grants, void
from metering.cli.imports import import_
from metering.cli.licenses import checkin, checkout
from metering.cli.limits import limits
from metering.cli.portal import portal
from metering.cli.prices import prices
from metering.cli.queue import emit, prune, rejected, worker
from metering.cli.reports import report
from metering.cli.reservations import reservations, reserve
from metering.cli.serve import serve
from metering.cli.simulate import simulate
from metering.cli.status import status
from metering.cli.webhooks import webhooks
from metering.settings import database_url

__all__ = ["main"]


@click.group(
    "metering", cls=MeteringGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@database_option
@click.version_option(package_name="metering", prog_name="metering")
@click.pass_context
def main(ctx: click.Context, database: str | None) -> None:
    """Quota metering for consumption billing: limits, decisions and counters."""
    ctx.obj = AppState(database_url(database))


for command in (
    limits,
    entitlements,
    prices,
    grants,
    alerts,
    void,
    corrections,
    consume,
    check,
    result,
    reset,
    counters,
    import_,
    seats,
    db,
    emit,
    worker,
    rejected,
    prune,
    demo,
    report,
    simulate,
    webhooks,
    reserve,
    reservations,
    checkout,
    checkin,
    status,
    serve,
    apikeys,
    portal,
):
    main.add_command(command)
