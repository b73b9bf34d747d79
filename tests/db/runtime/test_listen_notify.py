"""LISTEN/NOTIFY pickup: enqueue notifies on commit only; an idle worker wakes at once; a lost listener falls back to polling."""

from __future__ import annotations

import select
import threading
import time

from runledger_sync.core.records import JobSpec
from runledger_sync.db.engine import create_engine
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.worker import listener as listener_module
from runledger_sync.runtime.worker import loop as worker_module
from runledger_sync.runtime.worker.loop import WorkerLoop, run_worker_loop
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store import notify
from runledger_sync.store.driver import driver_for
from tests.handlers import fast_config
from tests.support import JOB_TYPE, ClaimWatch, define, rows, scalar, wait_until

#: Far longer than any bound asserted below, so polling cannot explain a fast pickup.
LONG_POLL_MS = 5_000
PICKUP_BOUND_SECONDS = 1.0


class Starts:
    """A handler that records when each job started (perf_counter) and signals it."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.started = threading.Condition()

    def __call__(self, ctx, payload) -> None:
        with self.started:
            self.times[payload["name"]] = time.perf_counter()
            self.started.notify_all()

    def wait_for(self, name: str, timeout: float) -> float:
        with self.started:
            assert self.started.wait_for(lambda: name in self.times, timeout), f"job {name!r} did not start in {timeout} s"
            return self.times[name]


def registry_of(starts: Starts) -> JobRegistry:
    registry = JobRegistry()
    registry.job(JOB_TYPE)(starts)
    return registry


def listener_pids(engine) -> list[int]:
    return [row.pid for row in rows(
        engine,
        "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND datname = current_database()"
        " AND query = :query",
        name=notify.LISTENER_APPLICATION_NAME, query=f"LISTEN {notify.CHANNEL}",
    )]


def messages(logs, text: str) -> list[object]:
    return [record for record in logs.records if record.getMessage() == text]


def enqueue_and_time(engine, name: str) -> float:
    enqueue(engine, JOB_TYPE, {"name": name})
    return time.perf_counter()


def wait_idle_and_listening(logs, claims: ClaimWatch, connections: int = 1) -> None:
    """Wait until the worker's ``connections``-th LISTEN took effect and it claimed once more since.

    It claims once more after connecting, then settles into its long pause.
    """
    connected = wait_until(lambda: messages(logs, "listener connected")[connections - 1:])[0]
    wait_until(lambda: claims.claims_since(connected.created), what="a claim after the LISTEN")


def start_idle_worker(engine, start_loop, logs, starts: Starts, claims: ClaimWatch | None = None, **config):
    registry = registry_of(starts)
    registry.sync_definitions(engine)
    claims = claims or ClaimWatch()
    worker = start_loop("worker", registry, fast_config(**config), observer=claims)
    wait_until(lambda: listener_pids(engine))
    wait_idle_and_listening(logs, claims)
    return worker


def received(connection, timeout: float) -> set[str]:
    select.select([connection], [], [], timeout)
    return notify.read_notified_types(connection)


def test_enqueue_notifies_on_commit_only_and_not_for_delayed_jobs(engine):
    define(engine)
    listening = notify.open_listener(engine)
    try:
        with engine.connect() as conn:
            enqueue(conn, JOB_TYPE, {"name": "rolled-back"})
            conn.rollback()
        enqueue(engine, JOB_TYPE, {"name": "later"}, delay_seconds=60)
        assert received(listening, 0.3) == set()
        assert scalar(engine, "SELECT count(*) FROM job_queue") == 1

        enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(3)])
        assert received(listening, 2.0) == {JOB_TYPE}
        # One notification per distinct type in the batch.
        assert listening.notifies == []
    finally:
        notify.close_listener(listening)


def test_idle_worker_picks_up_a_new_job_long_before_its_poll(engine, start_loop, logs):
    starts = Starts()
    start_idle_worker(engine, start_loop, logs, starts, poll_interval_ms=LONG_POLL_MS)
    for n in range(3):
        committed = enqueue_and_time(engine, f"job-{n}")
        assert starts.wait_for(f"job-{n}", PICKUP_BOUND_SECONDS) - committed < PICKUP_BOUND_SECONDS


def test_rolled_back_enqueue_starts_nothing(engine, start_loop, logs):
    starts = Starts()
    # One slot: had the rolled-back job been written, it would start before any later one.
    start_idle_worker(engine, start_loop, logs, starts, poll_interval_ms=LONG_POLL_MS, max_global_concurrency=1)
    with engine.connect() as conn:
        enqueue(conn, JOB_TYPE, {"name": "rolled-back"})
        conn.rollback()
    enqueue_and_time(engine, "committed")
    starts.wait_for("committed", PICKUP_BOUND_SECONDS)
    assert list(starts.times) == ["committed"]
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE payload ->> 'name' <> 'committed'") == 0
    assert scalar(engine, "SELECT count(*) FROM job_events WHERE job_id NOT IN (SELECT id FROM job_queue)") == 0


def test_worker_polls_while_its_listener_is_lost(engine, start_loop, logs, monkeypatch):
    # Keep the listener down for the whole test, so only polling can start the job.
    monkeypatch.setattr(listener_module, "RECONNECT_SECONDS", 60.0)
    starts = Starts()
    start_idle_worker(engine, start_loop, logs, starts, poll_interval_ms=100)
    [pid] = listener_pids(engine)
    assert scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=pid)
    wait_until(lambda: messages(logs, "listener lost; polling"))
    enqueue_and_time(engine, "polled")
    starts.wait_for("polled", 5.0)
    assert listener_pids(engine) == []
    assert len(messages(logs, "listener lost; polling")) == 1
    assert len(messages(logs, "listener connected")) == 1


def test_worker_listens_again_after_losing_its_listener(engine, start_loop, logs):
    starts = Starts()
    claims = ClaimWatch()
    start_idle_worker(engine, start_loop, logs, starts, claims, poll_interval_ms=LONG_POLL_MS)
    [first] = listener_pids(engine)
    assert scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=first)
    wait_until(lambda: messages(logs, "listener lost; polling"))
    # Jobs enqueued while nobody listens are claimed right after the listener comes back.
    enqueue_and_time(engine, "while-lost")
    starts.wait_for("while-lost", 2 * listener_module.RECONNECT_SECONDS + PICKUP_BOUND_SECONDS)
    wait_until(lambda: [pid for pid in listener_pids(engine) if pid != first], timeout=5.0)
    assert len(messages(logs, "listener connected")) == 2
    assert len(messages(logs, "listener lost; polling")) == 1
    wait_idle_and_listening(logs, claims, connections=2)
    committed = enqueue_and_time(engine, "after")
    assert starts.wait_for("after", PICKUP_BOUND_SECONDS) - committed < PICKUP_BOUND_SECONDS


def test_worker_closes_its_listener_on_shutdown(engine, start_loop, logs):
    starts = Starts()
    worker = start_idle_worker(engine, start_loop, logs, starts, poll_interval_ms=LONG_POLL_MS)
    assert worker.stop() is not None
    wait_until(lambda: listener_pids(engine) == [], timeout=5.0)


def test_worker_without_listen_only_polls(engine, start_loop, logs):
    starts = Starts()
    registry = registry_of(starts)
    registry.sync_definitions(engine)
    loop = WorkerLoop(driver_for(engine), registry, fast_config(), threading.Event(), listen=False)
    try:
        assert loop.listener is None
        loop.pause()
        assert listener_pids(engine) == []
    finally:
        loop.drain()


def test_a_listen_that_stops_delivering_is_noticed_by_its_probe_and_listened_again(engine, logs, monkeypatch):
    # UNLISTEN behind the listener's back: its connection is fine and nothing errors,
    # but nothing arrives any more (as when a pooler moved the session away).
    monkeypatch.setattr(listener_module, "PROBE_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(listener_module, "RECONNECT_SECONDS", 0.2)
    monkeypatch.setattr(worker_module, "PROBE_INTERVAL_SECONDS", 0.05)
    registry = registry_of(Starts())
    registry.sync_definitions(engine)
    loop = WorkerLoop(driver_for(engine), registry, fast_config(poll_interval_ms=50), threading.Event())
    try:
        wait_until(lambda: loop.pause() or loop.listener.connected)
        with loop.listener._connection.cursor() as cursor:
            cursor.execute("UNLISTEN *")
        wait_until(lambda: loop.pause() or messages(logs, "listener lost; polling"), timeout=5.0)
        [lost] = messages(logs, "listener lost; polling")
        assert "no echo of a probe notification" in lost.error
        wait_until(lambda: loop.pause() or len(messages(logs, "listener connected")) == 2, timeout=5.0)
        assert len(listener_pids(engine)) == 1
    finally:
        loop.drain()
    assert listener_pids(engine) == []


def test_an_engine_in_transaction_pool_mode_never_listens_and_says_so(fresh_database, logs):
    engine = create_engine(fresh_database, pool_mode="transaction")
    starts = Starts()
    registry = registry_of(starts)
    registry.sync_definitions(engine)
    shutdown = threading.Event()
    worker = threading.Thread(target=run_worker_loop, args=(engine, registry, fast_config(poll_interval_ms=100), shutdown))
    worker.start()
    try:
        wait_until(lambda: messages(logs, "worker started"))
        enqueue_and_time(engine, "polled")
        starts.wait_for("polled", 5.0)
        assert listener_pids(engine) == []
        assert scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND datname = current_database()",
                      name=notify.LISTENER_APPLICATION_NAME) == 0
    finally:
        shutdown.set()
        worker.join(15)
        engine.dispose()
    assert messages(logs, "worker started")[0].listen is False
    [said] = messages(logs, "pool mode transaction: no LISTEN; idle workers poll")
    assert said.poll_interval_ms == 100
    assert messages(logs, "listener connected") == []
