"""The command line's state and its one error path.

`AppState` holds the database URL chosen with ``--database`` (or
``METERING_DATABASE_URL``); `current_meter` opens a `Meter` on it on first
use and closes it with the command. Errors are handled once, in
`MeteringGroup`: every `MeteringError` and every click usage error becomes
one ``error: ...`` line on stderr and exit code 1.
"""

from __future__ import annotations

import difflib
import inspect
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

import click

from metering.errors import MeteringError, UnknownLimit
from metering.settings import data_home

if TYPE_CHECKING:
    from metering.meter import Meter

F = TypeVar("F", bound=Callable[..., Any])

MAX_ERROR_CHARS: Final = 400
# A word click takes for an option that is a negative number (-5, -1.5).
NEGATIVE_NUMBER: Final = re.compile(r"-[0-9]+(\.[0-9]+)?")
# Files the command line makes for itself (the demo's, beat's schedule) go here.
DEFAULT_DATA_DIRECTORY: Final = ".metering"


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
def one_line_errors() -> Iterator[None]:
    """Turn usage errors and `MeteringError` into `CliError`.

    A group given no command is not an error: its help goes to stdout, exit 0.
    """
    try:
        yield
    except CliError:
        raise
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help(), color=exc.ctx.color)
        raise click.exceptions.Exit(0) from None
    except click.NoSuchOption as exc:
        raise CliError(_no_such_option(exc)) from None
    except click.UsageError as exc:
        raise CliError(exc.format_message() + _help_hint(exc.ctx)) from None
    except click.ClickException as exc:
        raise CliError(exc.format_message()) from None
    except UnknownLimit as exc:
        raise CliError(_unknown_limit(exc)) from None
    except MeteringError as exc:
        raise CliError(str(exc)) from None


def _unknown_limit(exc: UnknownLimit) -> str:
    """The error, or the defined limits nearest the name (did you mean) when there are some."""
    state = click.get_current_context(silent=True)
    found = state.find_object(AppState) if state is not None else None
    if found is None or found.meter is None:
        return str(exc)
    return did_you_mean(found.meter, exc.limit) or str(exc)


def did_you_mean(meter: Meter, limit: str) -> str | None:
    """``unknown limit 'x': did you mean 'y'?`` for the defined limits nearest
    ``limit``; None when none is near."""
    names = [defined.name for defined in meter.list_limits()]
    near = difflib.get_close_matches(limit, names, n=3, cutoff=0.6)
    if not near:
        return None
    choices = " or ".join(repr(name) for name in near)
    return f"unknown limit {limit!r}: did you mean {choices}? (`metering limits list`)"


def _help_hint(ctx: click.Context | None) -> str:
    return f" (see '{ctx.command_path} --help')" if ctx is not None else ""


def _no_such_option(exc: click.NoSuchOption) -> str:
    """What an unknown option was most likely meant to be.

    click reads any word that starts with ``-`` as an option: a negative
    number given for a numeric argument is one (the argument's own rule is
    the error), and an option of ``metering`` itself given after the
    command is another (it goes before the command).
    """
    ctx, name = exc.ctx, exc.option_name
    if ctx is None:
        return exc.format_message()
    if NEGATIVE_NUMBER.fullmatch(name):
        numeric = [
            param
            for param in ctx.command.params
            if isinstance(param, click.Argument)
            and isinstance(param.type, click.types.IntParamType | click.types.FloatParamType)
        ]
        if len(numeric) == 1:
            [argument] = numeric
            minimum = getattr(argument.type, "min", None)
            least = 1 if minimum is None else minimum
            return (
                f"{argument.human_readable_name} must be a whole number of at least {least}, "
                f"got {name}"
            )
        return (
            f"{name} is not an option; an argument that starts with '-' goes after '--' "
            f"(metering ... -- {name})" + _help_hint(ctx)
        )
    root = ctx.find_root()
    own = [param for param in root.command.params if name in param.opts]
    if root is not ctx and own:
        [option] = own
        command = ctx.command_path.removeprefix(root.command_path).strip()
        value = "" if getattr(option, "is_flag", False) else f" {option.metavar or 'VALUE'}"
        return (
            f"{name} is an option of {root.command_path} itself: give it before the "
            f"command ({root.command_path} {name}{value} {command} ...)"
        )
    return exc.format_message() + _help_hint(ctx)


def first_sentence(command: click.Command) -> str:
    """A command's summary: its ``short_help``, else the first sentence of its
    help, whole (click would cut it at the terminal's width)."""
    if command.short_help:
        return command.short_help
    paragraph = inspect.cleandoc(command.help or "").split("\n\n")[0]
    text = " ".join(paragraph.split())
    end = re.search(r"\.(\s|$)", text)
    return text if end is None else text[: end.start()] + "."


class SentenceGroup(click.Group):
    """A group whose help lists each command with its first sentence, never cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, first_sentence(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class MeteringGroup(SentenceGroup):
    """A group that turns `MeteringError` and usage errors into `CliError`."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors():
            return super().invoke(ctx)


@dataclass
class AppState:
    """What the root command chose: the database URL, and the `Meter` once opened."""

    url: str
    meter: Meter | None = field(default=None, repr=False)


def database_url() -> str:
    """The database URL the root command chose."""
    state = click.get_current_context().find_object(AppState)
    if state is None:
        raise CliError("no database configured")
    return state.url


def current_meter() -> Meter:
    """The command's `Meter`, opened on first use and closed with the context."""
    ctx = click.get_current_context()
    state = ctx.find_object(AppState)
    if state is None:
        raise CliError("no database configured")
    if state.meter is None:
        # Imported here: the database stack is most of a command's start-up,
        # and `--version`, `--help` and the usage errors need none of it.
        from metering.meter import Meter

        state.meter = ctx.find_root().with_resource(Meter(state.url))
    return state.meter


def database_option(func: F) -> F:
    """``--database URL`` (or ``METERING_DATABASE_URL``) on the root command."""
    return click.option(
        "--database",
        metavar="URL",
        envvar="METERING_DATABASE_URL",
        show_envvar=True,
        help="Database URL (postgresql://... or sqlite:///file.db). "
        "Default: sqlite:///metering.db.",
    )(func)


def data_directory() -> Path:
    """Where the command line keeps its own files: ``METERING_HOME``, else ./.metering.

    The demo's databases and log and beat's schedule go there, not loose in
    the working directory. It is created when missing.
    """
    chosen = data_home()
    directory = Path(chosen or DEFAULT_DATA_DIRECTORY).absolute()
    where = f"METERING_HOME={chosen}" if chosen else f"the data directory {directory}"
    if directory.exists() and not directory.is_dir():
        raise CliError(f"{where} is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except NotADirectoryError:
        raise CliError(f"{where} cannot be created: a part of its path is a file") from None
    except OSError as exc:
        raise CliError(f"{where} cannot be created: {exc.strerror or exc}") from None
    try:
        # A directory that exists but takes no files (/proc, read-only): found
        # now, not as a traceback from SQLite or celery beat later.
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise CliError(f"{where} does not take files: {exc.strerror or exc}") from None
    return directory
