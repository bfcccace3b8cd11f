"""A `metering` command that forks from a process which has imported the CLI.

Each ``metering`` process of the docs' examples spends about a second of CPU
importing the package before it does anything. `serve` runs one process
that imports `metering.cli` and its command modules once, listens on a Unix
socket, and forks a child for every command: the child takes the caller's
standard streams (passed over the socket), working directory, environment
and arguments, runs `metering.cli.main` as ``metering`` would, and its exit
status goes back to the caller. `write_shim` writes the ``metering`` the
docs find first on ``PATH``: it forwards SIGTERM, SIGINT and SIGHUP to the
child and exits as it did, and it runs the real ``metering`` instead for
the commands that start long-lived processes (`serve`, `worker`, `status`,
`demo`) and whenever the server does not answer.

Only the standard library is imported at the top: the shim runs this file
with ``python -IS`` (a few milliseconds).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path

# Commands that start servers, workers or other processes run as themselves.
OWN_PROCESS = frozenset({"serve", "worker", "status", "demo"})
# Imported before the fork: none reads the environment at import time
# (`metering.settings` reads it when asked). The rest load in the child.
PRELOADED = tuple(
    f"metering.cli.{name}"
    for name in (
        "limits",
        "entitlements",
        "prices",
        "grants",
        "alerts",
        "events",
        "imports",
        "db",
        "reports",
        "simulate",
        "webhooks",
        "reservations",
        "licenses",
        "apikeys",
        "portal",
    )
)
_STATUS = struct.Struct("!i")


def _receive(connection: socket.socket) -> tuple[dict[str, object], list[int]]:
    data, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 20)
        if not more:
            raise ConnectionError("the client left mid-request")
        data += more
    return json.loads(data), fds


def _run_command(request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the caller's ``metering`` process; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
        os.chdir(str(request["cwd"]))
        environ = request["env"]
        assert isinstance(environ, dict)
        os.environ.clear()
        os.environ.update(environ)
        arguments = request["argv"]
        assert isinstance(arguments, list)
        sys.argv = ["metering", *arguments]
        from metering.cli import main

        try:
            main(args=arguments, prog_name="metering")
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the reader may be gone
                stream.flush()
        os._exit(code)


def _handle(connection: socket.socket) -> None:
    """In a child per connection: fork the command, report its pid and status."""
    request, fds = _receive(connection)
    pid = os.fork()
    if pid == 0:
        connection.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    connection.sendall(_STATUS.pack(pid))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    connection.sendall(_STATUS.pack(code))


def serve(path: str) -> None:
    """Import the CLI, then answer commands on the Unix socket ``path`` until killed."""
    import importlib

    import metering.cli  # noqa: F401

    for module in PRELOADED:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    Path(path + ".ready").touch()
    while True:
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(connection)
            finally:
                os._exit(0)
        connection.close()


def client(path: str, real: str) -> None:
    """The shim: run ``metering`` with this process's arguments through the server."""
    arguments = sys.argv[1:]
    if OWN_PROCESS.intersection(arguments):
        os.execv(real, [real, *arguments])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        os.execv(real, [real, *arguments])
    request = {"argv": arguments, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    pid = _STATUS.unpack(_read(connection, _STATUS.size))[0]

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    code = _STATUS.unpack(_read(connection, _STATUS.size))[0]
    if code < 0:  # killed by a signal: die of the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        try:
            more = connection.recv(size - len(data))
        except InterruptedError:
            continue
        if not more:
            raise SystemExit(1)
        data += more
    return data


def write_shim(directory: Path, path: str, real: str) -> Path:
    """A ``metering`` executable in ``directory`` that runs commands through ``path``."""
    shim = directory / "metering"
    here = str(Path(__file__).parent)
    shim.write_text(
        f"#!{sys.executable} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "from command_server import client\n"
        f"client({path!r}, {real!r})\n"
    )
    shim.chmod(0o755)
    return shim


_started: list[Path] = []  # the directory of this process's shim, once started


def shim_directory(start_seconds: float = 60.0) -> Path:
    """The directory of a ``metering`` (`write_shim`) whose server this
    process starts on first use (the suite's ``metering`` of the docs and
    of the tests that run the command in a terminal); stopped at exit."""
    if _started:
        return _started[0]
    import shutil
    import subprocess
    import tempfile
    import time

    directory = Path(tempfile.mkdtemp(prefix="metering-commands-"))
    socket_path = str(directory / "commands.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    # The package of this checkout, wherever the venv's editable install points.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    server = subprocess.Popen(
        [sys.executable, __file__, socket_path],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )

    def stop() -> None:
        server.kill()
        server.wait(30)
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(stop)
    deadline = time.monotonic() + start_seconds
    while not Path(socket_path + ".ready").exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("tests/command_server.py did not start")
        time.sleep(0.02)
    write_shim(directory, socket_path, str(Path(sys.executable).parent / "metering"))
    _started.append(directory)
    return directory


if __name__ == "__main__":
    serve(sys.argv[1])
