"""A `metering worker` rides out its servers going away.

The worker is started as an operator starts it (``metering worker``), on the
test session's real Redis and PostgreSQL, which are stopped and started again
on the same port while the worker is applying.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from pipeline_checks import (
    CALLS,
    assert_each_once_and_counters_exact,
    queue_state,
    stream,
    wait_for_results,
    wait_until,
)
from servers import PostgresServer, RedisServer
from sqlalchemy.engine import make_url
from test_pipeline import StartWorker, Worker

from metering import Meter, make_event
from metering.domain.events import Rejected
from metering.pipeline.messages import encode_batch, encode_event
from metering.pipeline.producer import make_celery
from metering.pipeline.routing import APPLY_BATCH_TASK, DEFAULT_QUEUE

pytestmark = pytest.mark.slow


def psycopg_connection(url: str) -> psycopg.Connection:
    """A plain psycopg connection to the database of a SQLAlchemy ``url``."""
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host, port=parsed.port, user=parsed.username, dbname=parsed.database
    )


def stopped(worker: Worker) -> bool:
    return not worker.alive() or "Unrecoverable error" in worker.log()


# -- Redis restarted under load -----------------------------------------------------


def test_a_worker_survives_a_redis_restart_while_it_holds_a_message(
    pg_url: str, redis_url: str, redis_server: RedisServer, start_worker: StartWorker
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker(cli=True)
        with psycopg_connection(pg_url) as blocker:
            # The worker takes the one batch queued before the restart and
            # cannot commit it (results are locked): it holds the message,
            # unacknowledged, while it waits on the empty queue for more.
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            before = list(stream(redis_url, at, "before", 50, subjects=10, seed=6))
            with redis_server.client() as client:
                wait_until(
                    lambda: queue_state(client) == (0, 1),
                    30,
                    lambda: f"queue (waiting, unacked) = {queue_state(client)}",
                    [worker],
                )
            try:
                redis_server.stop()
            finally:
                redis_server.start()
            # The worker reconnects (or, as it did, stops: "Unrecoverable error").
            wait_until(
                lambda: worker.log().count("Connected to") >= 2 or stopped(worker),
                60,
                lambda: "the worker did not reconnect",
                [worker],
            )
            assert not stopped(worker), worker.tail()
        after = list(stream(redis_url, at, "after", 1_000, subjects=10, seed=7))
        emitted = before + after
        wait_for_results(meter, len(emitted), [worker])
        with redis_server.client() as client:  # a connection made after the restart
            wait_until(
                lambda: queue_state(client) == (0, 0),
                60,
                lambda: f"queue (waiting, unacked) = {queue_state(client)}",
                [worker],
            )
        assert_each_once_and_counters_exact(meter, emitted, [worker])
        assert not stopped(worker), worker.tail()
        assert "Traceback" not in worker.log(), worker.tail()


def test_a_redis_killed_with_events_queued_loses_none(
    pg_url: str, redis_url: str, redis_server: RedisServer, start_worker: StartWorker
) -> None:
    """Events queued with no worker up; Redis dies (SIGKILL: no shutdown
    flush). Its append-only file has every command it answered (fsynced each
    second: a process crash loses nothing, a machine's the last second), so
    the worker started after it comes back applies each event once."""
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        emitted = list(stream(redis_url, at, "killed", 2_000, subjects=10, seed=8))
        with redis_server.client() as client:
            assert queue_state(client)[0] > 0  # waiting, nobody consuming
        redis_server.kill()
        redis_server.start()
        worker = start_worker(cli=True)
        wait_for_results(meter, len(emitted), [worker])
        assert_each_once_and_counters_exact(meter, emitted, [worker])


# -- the database unreachable at start, and gone for a while later ------------------


def closed_port() -> int:
    """A loopback port nothing listens on (free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_metering_worker_with_an_unreachable_database_exits_with_one_error_line(
    redis_url: str, tmp_path: Path
) -> None:
    database = f"postgresql://postgres@127.0.0.1:{closed_port()}/metering"
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    command = [sys.executable, "-m", "metering", "--database", database, "worker"]
    process = subprocess.Popen(
        [*command, "--broker", redis_url],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"the worker started anyway:\n{err[-3000:]}") from None
    assert process.returncode == 1, err
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("error: database unavailable: ")


def retry_waits(text: str) -> list[float]:
    """The waits of the delivery thread's warnings, in order."""
    found = re.findall(r"claiming webhook deliveries failed: .*; trying again in ([0-9.]+) s", text)
    return [float(wait) for wait in found]


def test_a_database_outage_is_one_warning_line_per_retry_and_the_worker_applies_after(
    pg_url: str,
    redis_url: str,
    postgres_server: PostgresServer,
    start_worker: StartWorker,
) -> None:
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        # With beat, so that periodic tasks meet the outage too.
        worker = start_worker(cli=True, beat=True, METERING_WEBHOOKS_INTERVAL="1")
        before = list(stream(redis_url, at, "up", 200, subjects=10, seed=8))
        wait_for_results(meter, len(before), [worker], timeout=60)
        offset = len(worker.log())

        def outage() -> str:
            return worker.log()[offset:]

        try:
            postgres_server.stop()
            during = list(stream(redis_url, at, "down", 200, subjects=10, seed=9))
            # Until each kind of retry has been logged a few times.
            wait_until(
                lambda: (
                    "Traceback" in outage()
                    or (
                        outage().count("batch not applied, retrying in") >= 3
                        and len(retry_waits(outage())) >= 4
                        and "sweep_webhook_resets_task skipped until its next run" in outage()
                    )
                ),
                120,
                lambda: "not every retry was logged",
                [worker],
            )
        finally:
            postgres_server.start()
        emitted = before + during
        wait_for_results(meter, len(emitted), [worker])
        assert_each_once_and_counters_exact(meter, emitted, [worker])
    log = outage()
    assert "Traceback" not in log, log[-5000:]
    assert "WARNING" in log and "database unavailable" in log
    # The delivery thread backs off: each wait at least the one before.
    waits = retry_waits(log)
    assert waits == sorted(waits) and waits[-1] > waits[0], waits
    assert worker.alive(), worker.tail()


# -- the embedded broker in two time zones ------------------------------------------

VISIBILITY_SECONDS = 300
SWEEP = """
import json, sys
from datetime import datetime
from metering.clock import FrozenClock
from metering.meter import Meter
from workers import tasks
for now in sys.argv[2:]:
    with Meter(sys.argv[1], clock=FrozenClock(datetime.fromisoformat(now))) as tasks._meter:
        print(json.dumps(tasks.sweep_embedded_broker_task()))
"""


def sweeps_at(
    env: dict[str, str], database: str, instants: list[datetime], tz: str
) -> list[dict[str, int]]:
    """Beat's sweeps of the embedded broker, one after the other, run by a
    process in ``tz`` whose clock says each of ``instants`` in turn (one
    process: a worker's imports are most of a sweep's CPU)."""
    done = subprocess.run(
        [sys.executable, "-c", SWEEP, database, *(now.isoformat() for now in instants)],
        env={**env, "TZ": tz},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results: list[dict[str, int]] = [
        json.loads(line) for line in done.stdout.splitlines()[-len(instants) :]
    ]
    return results


def taken_messages(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        [(taken,)] = connection.execute("SELECT count(*) FROM kombu_message WHERE NOT visible")
    return int(taken)


@pytest.mark.parametrize(
    ("taker", "sweeper"), [("Asia/Kathmandu", "UTC"), ("UTC", "Asia/Kathmandu")]
)
def test_the_embedded_broker_ages_a_dead_workers_message_in_utc(
    taker: str, sweeper: str, pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    at = datetime.now(UTC)
    env = {"METERING_BROKER_URL": broker, "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker(cli=True, TZ=taker, **env)
        with psycopg_connection(pg_url) as blocker:
            # The worker takes the batch and cannot commit it: it dies holding it.
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            first = datetime.now(UTC)
            emitted = list(stream(broker, at, "tz", 20, subjects=5, seed=10))
            wait_until(lambda: taken_messages(path) == 1, 60, lambda: "not taken", [worker])
            last = datetime.now(UTC)
            worker.kill()
            # Its transaction, waiting for the lock, goes with it (a pipeline
            # may have sent the commit already).
            blocker.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        visibility = timedelta(seconds=VISIBILITY_SECONDS)
        early, late = sweeps_at(
            worker.env,
            pg_url,
            [first + visibility - timedelta(seconds=1), last + visibility + timedelta(seconds=1)],
            sweeper,
        )
        assert early == {"restored": 0, "dead_lettered": 0}
        assert late == {"restored": 1, "dead_lettered": 0}
        assert taken_messages(path) == 0
        # Restored, it is applied by the next worker, once.
        second = start_worker(cli=True, TZ=sweeper, **env)
        wait_for_results(meter, len(emitted), [second], timeout=60)
        assert_each_once_and_counters_exact(meter, emitted, [worker, second])


# -- the embedded broker: messages that leave dead letters --------------------------


def broker_messages(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        [(count,)] = connection.execute("SELECT count(*) FROM kombu_message")
    return int(count)


def send_raw(broker: str, *payloads: object) -> None:
    """Queue ``payloads`` as the task's argument, as a hand-made producer could."""
    app = make_celery(broker)
    try:
        for payload in payloads:
            app.send_task(APPLY_BATCH_TASK, args=[payload], queue=DEFAULT_QUEUE)
    finally:
        app.close()


def test_the_embedded_broker_lets_go_of_a_batch_applied_with_a_malformed_event(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """A batch with an event that keeps its id but cannot be applied (its
    dead letter is kept, it gets no result) was never finished for the sweep:
    made visible again after every visibility timeout, and applied again, for
    ever. Acknowledged, it leaves the broker like any other."""
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    at = datetime.now(UTC)
    good = encode_event(make_event([("s-1", "calls", 2)], at, "good-1"))
    bad = encode_event(make_event([("s-1", "calls", 2)], at, "bad-1"))
    bad["charges"][0][2] = -1  # a negative cost: the event keeps a usable id
    env = {"METERING_BROKER_URL": broker, "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        send_raw(broker, encode_batch([good, bad]), {"not": "a batch"})
        worker = start_worker(cli=True, **env)
        wait_until(
            lambda: meter.decided(["good-1"]) and len(meter.rejected_messages()) == 2,
            60,
            lambda: f"rejected {meter.rejected_messages()}",
            [worker],
        )
        wait_until(lambda: broker_messages(path) == 0, 30, lambda: "still held", [worker])
        worker.stop()
    later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
    [swept] = sweeps_at(worker.env, pg_url, [later], "UTC")
    assert swept == {"restored": 0, "dead_lettered": 0}


def refuse_results_for(connection: psycopg.Connection, event_id: str) -> None:
    """A trigger that refuses the results row of one event, as a CHECK would."""
    connection.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF NEW.event_id = '{event_id}' THEN "
        "RAISE EXCEPTION 'refused' USING ERRCODE = '23514'; END IF; RETURN NEW; END $$"
    )
    connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON results FOR EACH ROW EXECUTE FUNCTION refuse()"
    )


def test_the_embedded_broker_lets_go_of_a_batch_with_a_part_the_database_refused(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """The refused part's dead letter names the database's error, so the
    sweep could not tell the batch done: it was taken again after every
    visibility timeout, for ever. Acknowledged, it leaves the broker."""
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    at = datetime.now(UTC)
    env = {"METERING_BROKER_URL": broker, "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        with psycopg_connection(pg_url) as connection:
            refuse_results_for(connection, "refused-1")
        events = [make_event([("s-1", "calls", 1)], at, i) for i in ("ok-1", "refused-1")]
        send_raw(broker, encode_batch([encode_event(e) for e in events]))
        worker = start_worker(cli=True, **env)
        wait_until(lambda: bool(meter.rejected_messages()), 60, lambda: "nothing refused", [worker])
        [(event_id, reason, _)] = meter.rejected_messages()
        assert (event_id, reason.split(":")[0]) == ("refused-1", "refused by the database")
        assert meter.decided(["ok-1", "refused-1"]) == {"ok-1"}
        wait_until(lambda: broker_messages(path) == 0, 30, lambda: "still held", [worker])
        worker.stop()
    later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
    assert sweeps_at(worker.env, pg_url, [later], "UTC") == [{"restored": 0, "dead_lettered": 0}]


def test_the_embedded_broker_lets_go_of_messages_that_are_no_task_it_runs(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """A hand-made message of a task the worker does not know, carrying a
    batch, and one that names no task at all: each is dead-lettered by the
    worker, and the first was taken again after every visibility timeout."""
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    batch = encode_batch([encode_event(make_event([("s-1", "calls", 1)], datetime.now(UTC), "x"))])
    env = {"METERING_BROKER_URL": broker, "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    app = make_celery(broker)
    try:
        app.send_task("metering.apply_batches", args=[batch], queue=DEFAULT_QUEUE)
        with app.connection_for_write() as connection:
            connection.SimpleQueue(DEFAULT_QUEUE).put({"hand": "made"})
    finally:
        app.close()
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        worker = start_worker(cli=True, **env)
        wait_until(lambda: len(meter.rejected_messages()) == 2, 60, lambda: "not kept", [worker])
        reasons = sorted(reason.split(":")[0] for _, reason, _ in meter.rejected_messages())
        assert reasons == ["message is not a task", "no such task"]
        wait_until(lambda: broker_messages(path) == 0, 30, lambda: "still held", [worker])
        worker.stop()
    later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
    assert sweeps_at(worker.env, pg_url, [later], "UTC") == [{"restored": 0, "dead_lettered": 0}]


def metering(database: str, *args: str) -> str:
    """``metering --database DATABASE ARGS``: its output (exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METERING_")}
    done = subprocess.run(
        [sys.executable, "-m", "metering", "--database", database, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


LOCK_WAITS = (
    "SELECT {} FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def lock_waits(url: str) -> int:
    """How many sessions of the database at ``url`` wait for a lock (asked in a
    transaction of its own: one sees the statistics of its first look only)."""
    with psycopg_connection(url) as connection:
        [(waiting,)] = connection.execute(LOCK_WAITS.format("count(*)")).fetchall()
    return int(waiting)


def end_lock_waits(url: str) -> None:
    """Terminate the sessions waiting for a lock: the transaction of a killed
    worker goes with its session (a pipeline may have sent the commit already)."""
    with psycopg_connection(url) as connection:
        connection.execute(LOCK_WAITS.format("pg_terminate_backend(pid)"))


def test_the_embedded_broker_keeps_a_message_never_finished_as_a_dead_letter(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """A message whose worker dies each time it takes it was given back after
    every visibility timeout, for ever. Taken METERING_BROKER_MAX_DELIVERIES
    times, it is kept instead: its events rejected with a reason naming the
    deliveries, listed by `metering rejected`, and applied, once, by
    `metering rejected replay`."""
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    at = datetime.now(UTC)
    env = {
        "METERING_BROKER_URL": broker,
        "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS),
        "METERING_BROKER_MAX_DELIVERIES": "2",
    }
    workers: list[Worker] = []
    swept: list[dict[str, int]] = []
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        emitted = list(stream(broker, at, "never", 20, subjects=5, seed=11))
        with psycopg_connection(pg_url) as blocker:
            # Each worker takes the batch and cannot commit it: it dies holding it.
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            for delivery in (1, 2):
                workers.append(start_worker(cli=True, **env))
                wait_until(lambda: taken_messages(path) == 1, 60, lambda: "not taken", workers)
                # Killed once its transaction waits: none of it reaches the database.
                wait_until(lambda: lock_waits(pg_url) > 0, 60, lambda: "no wait", workers)
                workers[-1].kill()
                end_lock_waits(pg_url)
                if delivery == 1:  # given back (the second sweep writes: after the lock)
                    later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
                    swept += sweeps_at(workers[-1].env, pg_url, [later], "UTC")
        later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
        swept += sweeps_at(workers[-1].env, pg_url, [later], "UTC")
        assert swept == [{"restored": 1, "dead_lettered": 0}, {"restored": 0, "dead_lettered": 1}]
        assert broker_messages(path) == 0
        ids = [event_id for event_id, _, _ in emitted]
        assert meter.outcome_counts() == {"rejected": len(ids)}
        reason = "delivered 2 times and never finished: taken off the queue"
        listed = json.loads(metering(pg_url, "rejected", "--last", "100", "--format", "json"))
        assert sorted((row["event_id"], row["reason"]) for row in listed) == sorted(
            (event_id, reason) for event_id in ids
        )
        replayed = metering(pg_url, "rejected", "replay")
        assert replayed.startswith(f"replayed {len(ids)} events ({len(ids)} allowed)"), replayed
        assert_each_once_and_counters_exact(meter, emitted, workers)
        assert meter.rejected_messages() == []


def _kept_after_a_worker_died_keeping_it(
    pg_url: str, tmp_path: Path, start_worker: StartWorker, meter: Meter, message: object
) -> list[Rejected]:
    """``message`` sent to a worker that takes it and dies while it waits to keep
    a dead letter (the table locked); the sweep gives it back (nothing was
    kept), and the next worker keeps one: the dead-letter record then."""
    path = tmp_path / "broker.db"
    broker = f"sqla+sqlite:///{path}"
    env = {"METERING_BROKER_URL": broker, "METERING_VISIBILITY_TIMEOUT": str(VISIBILITY_SECONDS)}
    worker = start_worker(cli=True, **env)
    with psycopg_connection(pg_url) as blocker:
        blocker.execute("LOCK TABLE rejected_messages IN SHARE ROW EXCLUSIVE MODE")
        send_raw(broker, message)
        wait_until(lambda: taken_messages(path) == 1, 60, lambda: "not taken", [worker])
        wait_until(lambda: lock_waits(pg_url) > 0, 60, lambda: "no wait", [worker])
        worker.kill()
        end_lock_waits(pg_url)
    assert meter.rejected_messages() == []
    later = datetime.now(UTC) + timedelta(seconds=VISIBILITY_SECONDS + 1)
    assert sweeps_at(worker.env, pg_url, [later], "UTC") == [{"restored": 1, "dead_lettered": 0}]
    second = start_worker(cli=True, **env)
    wait_until(
        lambda: len(meter.rejected_messages()) == 1,
        60,
        lambda: "nothing was kept",
        [worker, second],
    )
    return meter.rejected_messages()


def test_the_embedded_broker_gives_back_a_dead_workers_message_whose_ids_were_decided(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """A killed worker's message whose event ids all had results (from other
    messages) was deleted by the sweep as if applied: an event reusing an id
    with other charges never got its conflict's dead letter. It is given back
    and the next worker keeps the conflict."""
    at = datetime.now(UTC)
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        meter.consume("s-1", "calls", 1, event_id="reused", occurred_at=at)
        reused = make_event([("s-1", "calls", 5)], at, "reused")
        message = encode_batch([encode_event(reused)])
        kept = _kept_after_a_worker_died_keeping_it(pg_url, tmp_path, start_worker, meter, message)
        [(event_id, reason, _)] = kept
        assert event_id == "reused" and "already recorded with different charges" in reason
        assert [c.used for c in meter.counters("s-1", "calls")] == [1]


def test_the_embedded_broker_gives_back_an_undecodable_message_a_dead_worker_held(
    pg_url: str, tmp_path: Path, start_worker: StartWorker
) -> None:
    """A message that is not a batch, taken by a worker killed before it
    kept the message's dead letter, was deleted by the sweep as if consumed:
    it reached the queue and was never recorded. It is given back instead,
    and the next worker keeps it in the dead-letter record."""
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        message = {"not": "a batch"}
        kept = _kept_after_a_worker_died_keeping_it(pg_url, tmp_path, start_worker, meter, message)
        [(event_id, reason, _)] = kept
        assert (event_id, reason) == (None, "not a metering batch (version 1)")


# -- Redis: a message whose worker dies each time it runs it -----------------------


def waiting_backends(url: str) -> dict[int, int]:
    """The sessions of the database at ``url`` waiting for a lock: pid -> client port."""
    with psycopg_connection(url) as connection:
        rows = connection.execute(LOCK_WAITS.format("pid, client_port")).fetchall()
    return {int(pid): int(port) for pid, port in rows}


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def owner_of_port(pids: list[int], port: int) -> int | None:
    """Which of ``pids`` holds the TCP socket of local ``port`` (/proc/net/tcp)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            mine = socket_inodes(pid)
            for table in ("tcp", "tcp6"):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    local, inode = fields[1], fields[9]
                    if int(local.rsplit(":", 1)[1], 16) == port and inode in mine:
                        return pid
    return None


def running_batch(url: str, worker: Worker, ended: set[int]) -> tuple[int, int]:
    """(backend pid, client port) of the session that waits on the test's lock
    for the worker's batch, other than those ``ended``."""
    found: dict[int, int] = {}

    def waiting() -> bool:
        found.update((p, port) for p, port in waiting_backends(url).items() if p not in ended)
        return bool(found)

    wait_until(waiting, 60, lambda: "the batch is not running", [worker])
    [(backend, port)] = found.items()
    return backend, port


def kill_each_run(url: str, worker: Worker, runs: int) -> None:
    """SIGKILL the pool process running the batch (waiting on the lock the test
    holds), ``runs`` times, as an OOM killer would: the worker gives the message
    back at once (``reject_on_worker_lost``) and runs it again in another."""
    ended: set[int] = set()
    for _ in range(runs):
        backend, port = running_batch(url, worker, ended)
        child = owner_of_port([p for p in worker.members() if p != worker.pid], port)
        assert child is not None, worker.tail()
        os.kill(child, signal.SIGKILL)
        with psycopg_connection(url) as connection:
            connection.execute("SELECT pg_terminate_backend(%s)", [backend])
        ended.add(backend)


def test_redis_keeps_a_message_whose_worker_dies_each_time_after_the_bound(
    pg_url: str, redis_url: str, start_worker: StartWorker
) -> None:
    """A batch whose pool process is killed each time it runs it was given back
    and run again, for ever. Run METERING_BROKER_MAX_DELIVERIES times and never
    finished, it is kept as on the embedded broker: its events rejected with a
    reason naming the deliveries, then applied once by their replay (`metering
    rejected replay`). A batch killed fewer times is applied, once."""
    at = datetime.now(UTC)
    worker = start_worker(METERING_BROKER_MAX_DELIVERIES="2")
    with Meter(pg_url) as meter:
        meter.set_limits([CALLS])
        with psycopg_connection(pg_url) as blocker:
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            once = list(stream(redis_url, at, "once", 10, subjects=3, seed=12))
            kill_each_run(pg_url, worker, 1)
        wait_for_results(meter, len(once), [worker], timeout=60)
        assert_each_once_and_counters_exact(meter, once, [worker])

        with psycopg_connection(pg_url) as blocker:
            blocker.execute("LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
            never = list(stream(redis_url, at, "never", 10, subjects=3, seed=13))
            kill_each_run(pg_url, worker, 2)
        wait_for_results(meter, len(once) + len(never), [worker], timeout=60)
        ids = [event_id for event_id, _, _ in never]
        assert meter.outcome_counts() == {"allowed": len(once), "rejected": len(ids)}
        reason = "delivered 2 times and never finished: taken off the queue"
        kept = sorted((event_id, why) for event_id, why, _ in meter.rejected_messages())
        assert kept == sorted((event_id, reason) for event_id in ids)
        replayed = meter.replay_rejected()
        assert sorted(d.event_id or "" for d in replayed.applied) == sorted(ids)
        assert_each_once_and_counters_exact(meter, once + never, [worker])
