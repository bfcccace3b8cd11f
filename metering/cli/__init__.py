"""The `metering` command line, assembled from one module per command group.

Errors are handled once, by the root group (`metering.cli.context`): every
`MeteringError` and every click usage error becomes one ``error: ...`` line
on stderr and exit code 1. Decisions exit 0 when allowed (or overage) and 2
when denied.
"""

from __future__ import annotations

import difflib
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
    "subjects": "metering.cli.subjects:subjects",
    "quarantine": "metering.cli.quarantine:quarantine",
    "void": "metering.cli.grants:void",
    "corrections": "metering.cli.grants:corrections",
    "consume": "metering.cli.events:consume",
    "check": "metering.cli.events:check",
    "result": "metering.cli.events:result",
    "reset": "metering.cli.events:reset",
    "counters": "metering.cli.events:counters",
    "usage": "metering.cli.events:usage",
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


# `metering --help` lists the commands by task, as `git help` does, each with
# a whole sentence (written here: listing them imports no command's module).
SECTIONS: dict[str, dict[str, str]] = {
    "Limits and customers": {
        "limits": "Define, list, delete and load limits.",
        "entitlements": "Give a subject its own maximum for a limit.",
        "grants": "Top up a subject's allowance for a limit.",
        "alerts": "Set a subject's own thresholds for a limit.",
        "subjects": "Set a subject's time zone: its days and months start at its midnight.",
        "quarantine": "List and release the subjects a limit's breaker holds.",
        "prices": "Price limits per unit; priced usage charges spend limits.",
    },
    "Usage": {
        "consume": "Decide and record a usage event.",
        "check": "What consume would decide now; records nothing.",
        "result": "Show an event's stored result, or that it is queued.",
        "reserve": "Consume now, with the option to give it back.",
        "reservations": "List, cancel and commit reservations.",
        "checkout": "Take a floating license.",
        "checkin": "Give a floating license back.",
        "seats": "The values holding a seat of a distinct limit.",
        "void": "Reverse an allowed event's charges.",
        "corrections": "List the voided events.",
        "reset": "Clear the current counters of a subject or limit.",
        "import": "Apply historical events from a JSON Lines or CSV file.",
    },
    "Reading": {
        "counters": "Show counters, every window, oldest first.",
        "usage": "A subject's usage now, and when it runs out at its rate.",
        "report": "Billing reports: overage, usage, shadow and spend.",
        "simulate": "Backtest proposed limits against recorded usage.",
        "portal": "Links to the usage page customers open.",
        "audit": "Check the ledger's invariants; exit 1 on a violation.",
    },
    "Queue and workers": {
        "emit": "Queue a usage event for the workers.",
        "worker": "Run a worker that applies queued events.",
        "rejected": "Show and replay what the workers could not apply.",
        "prune": "Delete records past their retention.",
        "status": "Check the database, the broker, queues and workers.",
    },
    "Server and setup": {
        "serve": "Serve the HTTP API.",
        "apikeys": "Create, list and revoke API keys of the HTTP API.",
        "webhooks": "Webhook endpoints and deliveries.",
        "db": "Database schema migrations.",
        "demo": "Run the whole pipeline on a throw-away database.",
    },
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

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if name not in COMMANDS and not name.startswith("-"):
            near = difflib.get_close_matches(name, COMMANDS, n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
            raise click.UsageError(f"no such command {name!r}{hint}", ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands by section, each with its whole sentence (`SECTIONS`)."""
        for title, commands in SECTIONS.items():
            with formatter.section(title):
                formatter.write_dl(list(commands.items()))


@click.group(
    "metering", cls=CommandsOnDemand, context_settings={"help_option_names": ["-h", "--help"]}
)
@database_option
@click.version_option(package_name="metering", prog_name="metering")
@click.pass_context
def main(ctx: click.Context, database: str | None) -> None:
    """Quota metering for consumption billing: limits, decisions and counters."""
    ctx.obj = AppState(database_url(database))
