"""A throw-away PostgreSQL server for the test suite.

`PostgresServer` runs a private cluster out of one directory: ``initdb`` on
first start, a loopback-only TCP listener on its own port, a log file beside
the data, and nothing shared with any system cluster. It can be stopped and
started again mid-test (same data, same port), which is how the suite
simulates a database outage.

PostgreSQL refuses to run as root. When the tests run as root (CI, containers)
every server binary is run as the ``postgres`` system user through
``runuser``, and the base directory is handed to that user. The base
directory therefore has to be reachable by ``postgres``: every ancestor must
be traversable (``o+x``). pytest's own temporary directories
(``/tmp/pytest-of-root``) are mode 0700, so under root pick a directory made
directly in ``/tmp`` instead.

`RedisServer` does the same for Redis (the Celery broker): a private
``redis-server`` started from a config file of its own in one directory,
loopback only, on its own port, with an append-only file so that a
``stop()``/``start()`` (a broker restart) keeps the queued messages. Redis runs
as whoever runs the tests; it needs no ``runuser``. It never reads the system's
``/etc/redis/redis.conf`` and never uses the system service's port 6379 while
that service runs, so a Redis that Debian's package started is left alone.
Commands go through redis-py (`redis_client`, `RedisServer.client`): a new
client, so a fresh connection, with timeouts and no retries.

`copy_sqlite` is the SQLite counterpart of `PostgresServer.copy_of`: a
migrated SQLite file copied, where migrating a fresh one would cost a
Hypothesis example more than the example itself.

This module deliberately does not import pytest; the fixtures that use it
live in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import psycopg
import redis
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.rows import TupleRow
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "PostgresServer",
    "RedisServer",
    "copy_sqlite",
    "find_pg_bindir",
    "find_redis_server",
    "free_port",
    "make_base_dir",
    "redis_client",
]

# Seconds. pg_ctl gets its own -t; the subprocess timeout is a backstop above it.
PG_CTL_WAIT = 60
SUBPROCESS_TIMEOUT = 90
INITDB_TIMEOUT = 120
CONNECT_TIMEOUT = 10
STATEMENT_TIMEOUT_MS = 60_000

# Linux's sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
_LOG_TAIL_LINES = 40
_PG_USER = "postgres"
_SETTINGS_FILE = "metering_tests.conf"
# Names of the databases `PostgresServer.copy_of` makes, unique in the session.
_copies = itertools.count()


def free_port() -> int:
    """A loopback TCP port free now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def copy_sqlite(template: Path, path: Path) -> str:
    """The URL of a copy of the SQLite database ``template`` made at ``path``
    (the suite's migrated ``sqlite_template``): the file copied when every
    commit is in it (no write-ahead log, or an empty one), else with SQLite's
    backup API, which reads the log too (and costs three times the CPU)."""
    log = Path(f"{template}-wal")
    if not log.exists() or log.stat().st_size == 0:
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"
    with (
        contextlib.closing(sqlite3.connect(template)) as source,
        contextlib.closing(sqlite3.connect(path)) as target,
    ):
        source.backup(target)
    return f"sqlite:///{path}"


def find_pg_bindir() -> Path | None:
    """Return a directory holding the PostgreSQL server binaries, or None.

    Prefers the newest Debian-style ``/usr/lib/postgresql/<version>/bin``
    that contains ``initdb``; falls back to ``pg_config --bindir`` when that
    directory has ``initdb`` too (``pg_config`` also ships with client-only
    installs, where it points at a directory without a server).
    """
    candidates: list[tuple[tuple[int, ...], Path]] = []
    for bindir in Path("/usr/lib/postgresql").glob("*/bin"):
        version = tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))
        if version and (bindir / "initdb").is_file():
            candidates.append((version, bindir))
    if candidates:
        return max(candidates)[1]

    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        result = subprocess.run(
            [pg_config, "--bindir"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    bindir = Path(result.stdout.strip())
    return bindir if (bindir / "initdb").is_file() else None


def _postmaster_is_alive(pid: int, owner: int) -> bool:
    """``pg_ctl``'s test of the pid in ``postmaster.pid``: not us nor our
    parent, and a process ``kill(pid, 0)`` reaches as the data directory's
    ``owner`` (pg_ctl runs as the postgres user where we are root; a
    process of another user is not the postmaster)."""
    if pid <= 0 or pid in (os.getpid(), os.getppid()):
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or somebody else's
        return False
    if os.geteuid() != 0:
        return True
    try:
        return os.stat(f"/proc/{pid}").st_uid == owner
    except OSError:  # gone since
        return False


def make_base_dir(parent: Path, prefix: str = "postgres-") -> Path:
    """Make a new, empty directory for a `PostgresServer` and return it.

    Normally a fresh directory under ``parent``. As root, the server runs as
    the postgres user, who may not be able to enter ``parent`` (pytest's
    ``/tmp/pytest-of-root`` is mode 0700), so the directory is made directly
    in the world-traversable ``/tmp`` instead; `PostgresServer` hands it to
    the postgres user. Either way the caller removes it (`destroy` does).
    """
    if os.geteuid() == 0:
        return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _conf_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class PostgresServer:
    """One private PostgreSQL cluster living in ``base_dir``.

    Layout: ``base_dir/data`` (the cluster), ``base_dir/postgres.log`` (server
    log), and the Unix socket in ``base_dir`` itself. Clients connect over TCP
    on 127.0.0.1 as the trust-authenticated superuser ``postgres``.

    ``durable=False`` (the default) turns off fsync, synchronous_commit and
    full_page_writes: a crash can lose or corrupt data, which is fine for a
    cluster that only lives as long as a test session, and much faster.
    A clean ``stop()``/``start()`` keeps all data either way.

    Use as a context manager to start on entry and `destroy` on exit.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        durable: bool = False,
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        resolved = bindir if bindir is not None else find_pg_bindir()
        if resolved is None:
            raise RuntimeError(
                "PostgreSQL server binaries (initdb, pg_ctl) not found: "
                "looked in /usr/lib/postgresql/*/bin and `pg_config --bindir`"
            )
        self.bindir: Path = resolved
        self.base_dir: Path = Path(base_dir).absolute()
        self.data_dir: Path = self.base_dir / "data"
        self.log_file: Path = self.base_dir / "postgres.log"
        self.durable: bool = durable
        # Server settings over ours (``{"max_connections": "12"}``).
        self.settings: dict[str, str] = dict(settings or {})
        self._port: int | None = port
        self._auto_port: bool = port is None
        self._started_once: bool = False
        self._as_root: bool = os.geteuid() == 0
        # Copies handed back, by template and prefix; how to empty them, by template.
        self._spare: dict[tuple[str, str], list[str]] = {}
        self._refills: dict[str, _Refill] = {}
        # The connection each copy was last emptied from, kept open, idle,
        # for its next `hand_back` (a new session's catalog look-ups cost
        # more than the emptying).
        self._keepers: dict[str, psycopg.Connection[TupleRow]] = {}

    # -- properties ----------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; fixed by the first `start` when none was given."""
        if self._port is None:
            raise RuntimeError("port is not chosen until the server is first started")
        return self._port

    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg 3 driver) of database ``dbname``."""
        return f"postgresql+psycopg://{_PG_USER}@127.0.0.1:{self.port}/{dbname}"

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the server; initialise the cluster on the first call.

        A no-op when already running. After `stop`, starts again on the same
        data directory and port. Raises RuntimeError, with the tail of the
        server log, when the server does not come up within the timeout.
        """
        if self.is_running():
            return
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb()
        elif self._port is None:
            self._port = self._configured_port()
        # Only a port we picked ourselves may be swapped when somebody grabbed
        # it between picking and binding, and only before anyone was given a
        # URL: a restart must come back on the same port.
        attempts = 3 if self._auto_port and not self._started_once else 1
        for attempt in range(1, attempts + 1):
            log_offset = self._log_size()
            result = self._pg_ctl("start", "-w", "-t", str(PG_CTL_WAIT), "-l", str(self.log_file))
            if result.returncode == 0 and self.is_running():
                self._started_once = True
                return
            self._stop_quietly()
            new_log = self._log_text(log_offset)
            if attempt < attempts and "could not bind" in new_log:
                self._port = free_port()
                self._write_settings()
                continue
            raise RuntimeError(
                f"PostgreSQL failed to start in {self.base_dir} "
                f"(pg_ctl exit {result.returncode}).\n"
                f"pg_ctl output:\n{result.stdout}{result.stderr}\n"
                f"Last lines of {self.log_file}:\n{self.log_tail()}"
            )

    def stop(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected).

        Safe to call when already stopped, never started, or destroyed.
        """
        if not self.is_running():
            return
        result = self._pg_ctl("stop", "-w", "-t", str(PG_CTL_WAIT), "-m", "fast")
        if result.returncode != 0 and self.is_running():
            # A fast shutdown waits for a checkpoint; do not let a wedged one
            # hang the test session.
            self._pg_ctl("stop", "-w", "-t", str(PG_CTL_WAIT), "-m", "immediate")
        if self.is_running():
            raise RuntimeError(
                f"PostgreSQL in {self.base_dir} did not stop.\n"
                f"pg_ctl output:\n{result.stdout}{result.stderr}\n"
                f"Last lines of {self.log_file}:\n{self.log_tail()}"
            )

    def is_running(self) -> bool:
        """True when a postmaster is running on this data directory: the pid
        on the first line of its ``postmaster.pid`` is a live process of the
        data directory's owner, neither us nor our parent. That is what
        ``pg_ctl status`` checks (`_postmaster_is_alive`), without a process
        (``runuser`` and ``pg_ctl``) started for every `pg_url` handed back."""
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first_line)
            owner = self.data_dir.stat().st_uid
        except (OSError, ValueError):
            return False
        return _postmaster_is_alive(pid, owner)

    def destroy(self) -> None:
        """Stop the server and delete ``base_dir`` with everything in it."""
        for keeper in self._keepers.values():
            keeper.close()
        self._keepers.clear()
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"PostgresServer(base_dir={str(self.base_dir)!r}, port={self._port!r})"

    # -- databases -----------------------------------------------------------

    def create_database(self, name: str, template: str | None = None) -> None:
        """``CREATE DATABASE name [TEMPLATE template]``.

        Copying a template fails while anything is connected to it, and only
        after PostgreSQL has waited 5 s for those sessions to leave. A pooled
        connection left over from migrating the template is the usual
        culprit, so sessions on the template are terminated first.
        """
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        with self._admin_connection() as conn:
            for attempt in range(1, 4):
                if template is not None:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()",
                        (template,),
                    )
                try:
                    conn.execute(statement)
                    return
                except pg_errors.ObjectInUse:
                    # Somebody connected again between terminate and copy.
                    if template is None or attempt == 3:
                        raise

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, disconnecting its sessions first."""
        keeper = self._keepers.pop(name, None)
        if keeper is not None:
            keeper.close()
        with self._admin_connection() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    @contextlib.contextmanager
    def copy_of(self, template: str, prefix: str = "copy") -> Iterator[str]:
        """The URL of a fresh copy of ``template`` (`take`), handed back
        (`hand_back`) after the block: a database per Hypothesis example,
        where a function-scoped fixture would be shared by every example."""
        name = self.take(template, prefix)
        try:
            yield self.url(name)
        finally:
            self.hand_back(template, name)

    def take(self, template: str, prefix: str = "copy") -> str:
        """The name of a database holding what ``template`` holds: a copy
        handed back before, else a new ``CREATE DATABASE ... TEMPLATE``."""
        spare = self._spare.setdefault((template, prefix), [])
        if spare:
            return spare.pop()
        name = f"{prefix}_{next(_copies)}"
        self.create_database(name, template=template)
        return name

    def hand_back(self, template: str, name: str) -> None:
        """Empty the copy ``name`` to ``template``'s contents for the next
        `take`, or drop it.

        `_Refill`: its sessions ended, every row deleted, the template's own
        rows put back, the sequences set back; a third of the time of ``DROP
        DATABASE`` and ``CREATE DATABASE ... TEMPLATE``. A copy whose schema
        is no longer the template's (a table, column, index, constraint,
        function, trigger, schema or database setting made, changed or
        removed: `_Refill.shape`) is dropped instead, as is one whose
        emptying fails.
        """
        refill = self._refills.get(template)
        if refill is None:
            refill = self._refills[template] = _Refill.of(self, template)
        conn = self._keepers.pop(name, None)
        try:
            try:
                reusable = self._empty(conn, refill) if conn is not None else None
            except psycopg.OperationalError:
                reusable = None  # its session ended (the server restarted, or a test ended it)
            if reusable is None:
                if conn is not None:
                    conn.close()
                conn = self.connect(name)
                reusable = self._empty(conn, refill)
        except BaseException:
            if conn is not None:
                conn.close()
            self.drop_database(name)
            raise
        if reusable:
            self._keepers[name] = conn
            prefix = name.rsplit("_", 1)[0]
            self._spare.setdefault((template, prefix), []).append(name)
        else:
            conn.close()
            self.drop_database(name)

    @staticmethod
    def _empty(conn: psycopg.Connection[TupleRow], refill: _Refill) -> bool:
        """End the copy's other sessions; refill it when its schema is still
        the template's (True), else leave it (False). ``conn`` is left idle,
        outside any transaction."""
        # The test's sessions ended from the copy's own (one connection, not two).
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        reusable = _Refill.shape(conn) == refill.template_shape
        if reusable:
            refill.run(conn)
        conn.commit()
        return reusable

    def forget(self, template: str) -> None:
        """Drop ``template`` and the copies of it handed back (a template
        a test made for itself, `copy_of` it no more)."""
        self._refills.pop(template, None)
        for (of, prefix), names in list(self._spare.items()):
            if of == template:
                del self._spare[of, prefix]
                for name in names:
                    self.drop_database(name)
        self.drop_database(template)

    def connect(self, dbname: str) -> psycopg.Connection[TupleRow]:
        """A new psycopg connection to ``dbname`` as the superuser (autocommit off)."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=_PG_USER,
            dbname=dbname,
            connect_timeout=CONNECT_TIMEOUT,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        )

    def _admin_connection(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=_PG_USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        )

    # -- logs ----------------------------------------------------------------

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log ("" when there is none)."""
        text = self._log_text(0)
        return "\n".join(text.splitlines()[-lines:])

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def _log_text(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    # -- internals -----------------------------------------------------------

    def _initdb(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(self.base_dir, _PG_USER, _PG_USER)
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            shutil.chown(self.data_dir, _PG_USER, _PG_USER)
            if self._run(["test", "-w", str(self.base_dir)], timeout=10).returncode != 0:
                raise RuntimeError(
                    f"user {_PG_USER!r} cannot write to {self.base_dir}: some parent "
                    "directory is not traversable by it (pytest's /tmp/pytest-of-root is "
                    "mode 0700); use a base directory made directly under /tmp"
                )
        result = self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "-U",
                _PG_USER,
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            timeout=INITDB_TIMEOUT,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed in {self.data_dir} (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        if self._port is None:
            self._port = free_port()
        self._write_settings()

    def _write_settings(self) -> None:
        """(Re)write our settings into an include file of postgresql.conf."""
        socket_dir = str(self.base_dir)
        if len(f"{socket_dir}/.s.PGSQL.{self.port}") > _MAX_SOCKET_PATH:
            # Too long for a Unix socket; TCP is all the tests use anyway.
            socket_dir = ""
        settings = {
            "listen_addresses": _conf_quote("127.0.0.1"),
            "port": str(self.port),
            "unix_socket_directories": _conf_quote(socket_dir),
            "max_connections": "200",
            "shared_buffers": _conf_quote("128MB"),
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        settings |= self.settings
        include = self.data_dir / _SETTINGS_FILE
        include.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
        main_conf = self.data_dir / "postgresql.conf"
        directive = f"include = {_conf_quote(include.name)}\n"
        if directive not in main_conf.read_text():
            with main_conf.open("a") as fh:
                fh.write("\n" + directive)
        if self._as_root:
            shutil.chown(include, _PG_USER, _PG_USER)

    def _configured_port(self) -> int:
        """The port an existing cluster was set up with (see `_write_settings`)."""
        text = (self.data_dir / _SETTINGS_FILE).read_text()
        match = re.search(r"^port = (\d+)$", text, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no port in {self.data_dir / _SETTINGS_FILE}")
        return int(match.group(1))

    def _stop_quietly(self) -> None:
        """Best effort: make sure a failed start leaves no postmaster behind."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if (self.data_dir / "postmaster.pid").exists():
                self._pg_ctl("stop", "-w", "-t", "10", "-m", "immediate")

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / "pg_ctl"), args[0], "-D", str(self.data_dir), *args[1:]]
        return self._run(cmd, timeout=SUBPROCESS_TIMEOUT)

    def _run(self, cmd: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server binary, as the postgres user when we are root."""
        argv = [*(["runuser", "-u", _PG_USER, "--"] if self._as_root else []), *cmd]
        # PG* variables (PGDATA, PGPORT, ...) from the caller must not redirect
        # these commands to some other cluster.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return subprocess.run(
            argv,
            # The caller's cwd may be unreadable for the postgres user.
            cwd=self.base_dir if self.base_dir.is_dir() else "/",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


_OWN = "NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
_SHAPE = f"""
SELECT md5(string_agg(item, E'\\n' ORDER BY item)) FROM (
    SELECT 'schema ' || nspname AS item FROM pg_namespace
    WHERE nspname {_OWN} AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast%'
    UNION ALL
    SELECT format('relation %s.%s %s', n.nspname, c.relname, c.relkind)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname {_OWN} AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast%'
    UNION ALL
    SELECT format('column %s.%s %s %s %s %s %s', n.nspname, c.relname, a.attnum, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE n.nspname {_OWN} AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast%'
      AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace IN (SELECT oid FROM pg_namespace WHERE nspname {_OWN})
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index
    WHERE indrelid IN (
        SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname {_OWN} AND n.nspname NOT LIKE 'pg_toast%'
    )
    UNION ALL
    SELECT format('function %s %s %s', p.oid::regprocedure, md5(p.prosrc), p.proconfig)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname {_OWN}
    UNION ALL
    SELECT format('trigger %s %s %s', tgrelid::regclass, tgname, tgenabled) FROM pg_trigger
    WHERE NOT tgisinternal
    UNION ALL
    SELECT format('setting %s %s', setrole, setconfig) FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
) AS items
"""


class _Refill:
    """What makes a used copy of a template hold what the template holds:
    its tables' rows deleted (foreign keys and triggers off for the
    transaction), the template's own rows inserted again, its sequences
    set back to the template's values."""

    def __init__(
        self,
        tables: list[str],
        rows: dict[str, list[tuple[object, ...]]],
        sequences: dict[str, tuple[int, bool]],
        template_shape: str,
    ) -> None:
        self.template_shape = template_shape
        self.tables = tables
        self.rows = rows
        self.sequences = sequences

    @classmethod
    def of(cls, server: PostgresServer, template: str) -> _Refill:
        with server.connect(template) as conn:
            tables = [
                name
                for (name,) in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
                )
            ]
            rows: dict[str, list[tuple[object, ...]]] = {}
            for table in tables:
                found = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
                if content := found.fetchall():
                    rows[table] = content
            sequences = {}
            for (name,) in conn.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"
            ).fetchall():
                state = sql.SQL("SELECT last_value, is_called FROM {}").format(sql.Identifier(name))
                last_value, is_called = conn.execute(state).fetchone() or (1, False)
                sequences[name] = (int(last_value), bool(is_called))
            shape = cls.shape(conn)
        return cls(tables, rows, sequences, shape)

    @staticmethod
    def shape(conn: psycopg.Connection[TupleRow]) -> str:
        """A digest of the database's schema outside PostgreSQL's own: its
        schemas, relations, columns and their defaults, constraints, indexes,
        functions, triggers, and the settings made for the database."""
        found = conn.execute(_SHAPE).fetchone()
        conn.rollback()
        return str(found[0] if found else "")

    def run(self, conn: psycopg.Connection[TupleRow]) -> None:
        statements = [sql.SQL("SET LOCAL session_replication_role = replica")]
        statements += [
            sql.SQL("DELETE FROM {}").format(sql.Identifier(table)) for table in self.tables
        ]
        statements += [
            sql.SQL("SELECT setval({}, {}, {})").format(
                sql.Literal(sequence), sql.Literal(value), sql.Literal(called)
            )
            for sequence, (value, called) in self.sequences.items()
        ]
        with conn.transaction():
            conn.execute(sql.SQL("; ").join(statements))
            for table, content in self.rows.items():
                marks = sql.SQL(", ").join(sql.Placeholder() * len(content[0]))
                insert = sql.SQL("INSERT INTO {} VALUES ({})").format(sql.Identifier(table), marks)
                with conn.cursor() as cursor:
                    cursor.executemany(insert, content)


# -- Redis -------------------------------------------------------------------

# Seconds.
REDIS_START_TIMEOUT = 20
REDIS_STOP_TIMEOUT = 20
REDIS_COMMAND_TIMEOUT = 10
_REDIS_POLL_INTERVAL = 0.05
_REDIS_CONFIG_FILE = "redis.conf"


def find_redis_server() -> Path | None:
    """Return the path of the ``redis-server`` executable on PATH, or None."""
    found = shutil.which("redis-server")
    return Path(found) if found is not None else None


def _redis_quote(value: str) -> str:
    """Quote a string for redis.conf (double quotes, backslash escapes)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def redis_client(port: int, *, db: int = 0, timeout: float = REDIS_COMMAND_TIMEOUT) -> redis.Redis:
    """A new redis-py client of the Redis on 127.0.0.1:``port``; close it after use.

    Its own connection pool, so its first command opens a fresh connection
    (after a restart, or while something else may hold the port, an old one
    would answer for the wrong server). ``timeout`` bounds the connect and
    every reply, and nothing is retried: redis-py's default retries would
    take seconds to report a server that is down. Failures raise redis-py's
    errors: `redis.ConnectionError` when nothing answers (its ``__context__``
    is the `OSError`), `redis.TimeoutError`, `redis.ResponseError` for an
    error reply.
    """
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        db=db,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


class RedisServer:
    """One private Redis server living in ``base_dir``.

    Layout: ``base_dir/redis.conf`` (written on the first `start`),
    ``base_dir/redis.log`` (the server log, plus anything it prints before the
    log is open, such as config errors) and, with ``appendonly``, the
    append-only files in ``base_dir/appendonlydir``. The server listens on
    127.0.0.1 only, with no password, and runs in the foreground as a child
    process of the test session (``daemonize no``).

    ``appendonly=True`` (the default) writes an append-only file fsynced once
    a second (``appendfsync everysec``), as the production broker does, so a
    clean ``stop()``/``start()`` keeps every key. ``appendonly=False`` keeps
    nothing across a restart. RDB snapshots are off either way.

    Use as a context manager to start on entry and `destroy` on exit.
    """

    def __init__(self, base_dir: Path, *, port: int | None = None, appendonly: bool = True) -> None:
        executable = find_redis_server()
        if executable is None:
            raise RuntimeError(
                "redis-server not found on PATH (Debian: apt-get install redis-server, "
                "or run scripts/ensure-servers.sh)"
            )
        self.executable: Path = executable
        self.base_dir: Path = Path(base_dir).absolute()
        self.config_file: Path = self.base_dir / _REDIS_CONFIG_FILE
        self.log_file: Path = self.base_dir / "redis.log"
        self.appendonly: bool = appendonly
        self._port: int | None = port
        self._auto_port: bool = port is None
        self._started_once: bool = False
        self._process: subprocess.Popen[bytes] | None = None

    # -- properties ----------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; fixed by the first `start` when none was given."""
        if self._port is None:
            raise RuntimeError("port is not chosen until the server is first started")
        return self._port

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        return self._process.pid if self.is_running() and self._process is not None else None

    def url(self, db: int = 0) -> str:
        """``redis://`` URL of database number ``db`` (0 to 15)."""
        if not 0 <= db <= 15:
            raise ValueError(f"Redis database number must be 0 to 15, not {db}")
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the server; write its config file on the first call.

        A no-op when already running. After `stop`, starts again with the
        same config, port and data. Raises RuntimeError, with the tail of the
        server log, when the server exits or does not answer PING within
        `REDIS_START_TIMEOUT` seconds.
        """
        if self.is_running():
            return
        self._reap()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._port is None and self.config_file.is_file():
            # A server set up earlier in this directory (another instance).
            self._port = self._configured_port()
        if self._port is None:
            self._port = free_port()
        self._write_config()
        # Only a port we picked ourselves may be swapped when somebody grabbed
        # it between picking and binding, and only before anyone was given a
        # URL: a restart must come back on the same port.
        attempts = 3 if self._auto_port and not self._started_once else 1
        for attempt in range(1, attempts + 1):
            log_offset = self._log_size()
            failure = self._launch_and_wait()
            if failure is None:
                self._started_once = True
                return
            new_log = self._log_text(log_offset)
            if attempt < attempts and "Address already in use" in new_log:
                self._port = free_port()
                self._write_config()
                continue
            raise RuntimeError(
                f"Redis failed to start in {self.base_dir} on port {self._port}: {failure}.\n"
                f"Last lines of {self.log_file}:\n{self.log_tail()}"
            )

    def stop(self) -> None:
        """Stop the server and wait for it to exit.

        SIGTERM makes Redis shut down as ``SHUTDOWN`` does: it flushes and
        fsyncs the append-only file first. A server that has not exited
        after `REDIS_STOP_TIMEOUT` seconds is killed. Safe to call when
        already stopped, never started, or destroyed.
        """
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=REDIS_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=REDIS_STOP_TIMEOUT)
        self._process = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash: no final flush or fsync (what its
        append-only file keeps is what it wrote before). `start` brings it back."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=REDIS_STOP_TIMEOUT)
        self._process = None

    def is_running(self) -> bool:
        """True while the server process this object started is alive."""
        return self._process is not None and self._process.poll() is None

    def destroy(self) -> None:
        """Stop the server and delete ``base_dir`` with everything in it."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"RedisServer(base_dir={str(self.base_dir)!r}, port={self._port!r})"

    # -- commands ------------------------------------------------------------

    def client(self, db: int = 0, timeout: float = REDIS_COMMAND_TIMEOUT) -> redis.Redis:
        """A new client of database ``db`` on a fresh connection; see `redis_client`."""
        return redis_client(self.port, db=db, timeout=timeout)

    def ping(self, timeout: float = REDIS_COMMAND_TIMEOUT) -> bool:
        """True when the server on our port answers PING with PONG."""
        try:
            with self.client(timeout=timeout) as client:
                return client.ping() is True
        except (OSError, redis.RedisError):
            return False

    def flushall(self) -> None:
        """Delete every key in every database (``FLUSHALL SYNC``)."""
        with self.client() as client:
            client.flushall(asynchronous=False)

    # -- logs ----------------------------------------------------------------

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log ("" when there is none)."""
        text = self._log_text(0)
        return "\n".join(text.splitlines()[-lines:])

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def _log_text(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    # -- internals -----------------------------------------------------------

    def _launch_and_wait(self) -> str | None:
        """Start the process and wait until it answers; None, or why it failed.

        On failure the process is gone when this returns.
        """
        with self.log_file.open("ab") as log:
            # Both the server log (`logfile`) and the console go to the log
            # file: config errors are printed before the log file is open.
            self._process = subprocess.Popen(
                [str(self.executable), str(self.config_file)],
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        process = self._process
        deadline = time.monotonic() + REDIS_START_TIMEOUT
        while True:
            code = process.poll()
            if code is not None:
                self._process = None
                return f"redis-server exited with status {code}"
            # PING alone could be answered by whatever else holds the port in
            # the moment before our server gives up on it: check the pid too.
            if self.ping(timeout=1) and self._answering_pid() == process.pid:
                return None
            if time.monotonic() >= deadline:
                self.stop()
                return f"no PONG within {REDIS_START_TIMEOUT} s"
            time.sleep(_REDIS_POLL_INTERVAL)

    def _answering_pid(self) -> int | None:
        try:
            with self.client(timeout=1) as client:
                info = client.info("server")
        except (OSError, redis.RedisError):
            return None
        pid = info.get("process_id")
        return pid if isinstance(pid, int) else None

    def _reap(self) -> None:
        """Forget a process that exited by itself (crashed or was killed)."""
        if self._process is not None and self._process.poll() is not None:
            self._process = None

    def _write_config(self) -> None:
        settings = [
            ("bind", "127.0.0.1"),
            ("port", str(self.port)),
            ("protected-mode", "yes"),
            ("daemonize", "no"),
            ("supervised", "no"),
            ("dir", _redis_quote(str(self.base_dir))),
            ("logfile", _redis_quote(str(self.log_file))),
            ("loglevel", "notice"),
            ("always-show-logo", "no"),
            ("databases", "16"),
            # No RDB snapshots: neither periodic saves nor one at shutdown.
            ("save", '""'),
            ("appendonly", "yes" if self.appendonly else "no"),
            ("appendfsync", "everysec"),
            ("appenddirname", _redis_quote("appendonlydir")),
        ]
        self.config_file.write_text(
            "# Written by tests/servers.py (RedisServer); rewritten on every start.\n"
            + "".join(f"{key} {value}\n" for key, value in settings)
        )

    def _configured_port(self) -> int:
        """The port an existing config file (see `_write_config`) names."""
        text = self.config_file.read_text()
        match = re.search(r"^port (\d+)$", text, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no port in {self.config_file}")
        return int(match.group(1))
