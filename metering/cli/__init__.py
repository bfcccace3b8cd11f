"""The `metering` command line, assembled from one module per command group.

Errors are handled once, by the root group (`metering.cli.context`): every
`MeteringError` and every click usage error becomes one ``error: ...`` line
on stderr and exit code 1. Decisions exit 0 when allowed (or overage) and 2
when denied.
"""

from __future__ import annotations

import importlib

import click

from metering.cli.context import AppState, MeteringGroup, database_option
from metering.settings import database_url

__all__ = ["main"]

# Each command's module, imported only when the command runs (or when --help
# lists them all): `metering consume` then loads neither the HTTP API nor
# Celery, and starts in about half the time.
COMMANDS: dict[str, str] = {
    "limits": "metering.cli.limits:limits",
    "entitlements": "metering.cli.entitlements:entitlements",
    "prices": "metering.cli.prices:prices",
    "grants": "metering.cli.grants:grants",
    "alerts": "metering.cli.alerts:alerts",
    "void": "metering.cli.grants:void",
    "corrections": "metering.cli.grants:corrections",
    "consume": "metering.cli.events:consume",
    "check": "metering.cli.events:check",
    "result": "metering.cli.events:result",
    "reset": "metering.cli.events:reset",
    "counters": "metering.cli.events:counters",
    "import": "metering.cli.imports:import_",
    "seats": "metering.cli.events:seats",
    "db": "metering.cli.db:db",
    "emit": "metering.cli.queue:emit",
    "worker": "metering.cli.queue:worker",
    "rejected": "metering.cli.queue:rejected",
    "prune": "metering.cli.queue:prune",
    "demo": "metering.cli.demo:demo",
    "report": "metering.cli.reports:report",
    "simulate": "metering.cli.simulate:simulate",
    "webhooks": "metering.cli.webhooks:webhooks",
    "reserve": "metering.cli.reservations:reserve",
    "reservations": "metering.cli.reservations:reservations",
    "checkout": "metering.cli.licenses:checkout",
    "checkin": "metering.cli.licenses:checkin",
    "status": "metering.cli.status:status",
    "audit": "metering.cli.audit:audit",
    "serve": "metering.cli.serve:serve",
    "apikeys": "metering.cli.apikeys:apikeys",
    "portal": "metering.cli.portal:portal",
}


class CommandsOnDemand(MeteringGroup):
    """The root group: a command's module is imported when it is first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, name = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), name)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


@click.group(
    "metering", cls=CommandsOnDemand, context_settings={"help_option_names": ["-h", "--help"]}
)
@database_option
@click.version_option(package_name="metering", prog_name="metering")
@click.pass_context
def main(ctx: click.Context, database: str | None) -> None:
    """Quota metering for consumption billing: limits, decisions and counters."""
    ctx.obj = AppState(database_url(database))
