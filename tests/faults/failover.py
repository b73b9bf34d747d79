"""A primary killed mid-run and its standby promoted, with workers on a multi-host URL.

The scenario shared by ``tests/faults/test_failover.py`` (synchronous replication:
nothing acknowledged may be lost) and ``bench/failover.py`` (asynchronous: it
counts what was). Two ``fault_worker`` processes run EFFECT jobs through libpq's
multi-host URL with ``target_session_attrs=read-write``; half the jobs are
enqueued before they start and a producer enqueues the rest across the failover,
each batch retried with the same idempotency keys until acknowledged. When a
third of the jobs have succeeded the primary is killed (``pg_ctl stop -m
immediate``) and the standby promoted (``pg_ctl promote``).

Every figure is read from the promoted server's rows, against what the scenario
was told before the kill: the ids whose enqueue was acknowledged, and the jobs a
reader saw SUCCEEDED on the primary (an outcome the worker was acknowledged too).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy

import runledger_sync as rl
from tests.faults.fault_worker import EFFECT, WorkerSettings, build_registry
from tests.faults.harness import Db, WorkerFleet
from tests.faults.replication import ReplicatedPair

DATABASE = "failover"
#: The issue's bound: every job SUCCEEDED within this long of the promotion.
RECOVERY_BOUND_SECONDS = 90.0
#: The producer's batches: 10 jobs each 50 ms (200 jobs/s, about the two workers' pace here),
#: so the second half of the jobs is still being enqueued when the primary dies.
BATCH = 10
BATCH_PAUSE_SECONDS = 0.05
POLL_INTERVAL_MS = 5000


@dataclass
class FailoverReport:
    jobs: int
    synchronous: bool
    lag_seconds: float = 0.0
    succeeded_at_kill: int = 0
    #: WAL the primary had written and the standby not yet flushed, read just before the kill.
    wal_behind_bytes_at_kill: int = 0
    acknowledged_at_kill: int = 0
    #: Enqueues acknowledged before the kill whose job is missing after the promotion
    #: (a job enqueued and finished within the lost window is gone with its outcome).
    lost_enqueues: int = 0
    #: Jobs seen SUCCEEDED on the primary before the kill that ran again after it.
    lost_outcomes: int = 0
    #: Jobs run more than once (attempt rows, handler effects, lost outcomes); and those of
    #: them not in flight at the kill (first run after it, or finished before it).
    reruns: int = 0
    reruns_not_in_flight: int = 0
    #: The most attempts any job spent.
    max_attempt: int = 0
    dead_lettered: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    #: From the promotion until every job had SUCCEEDED (None: not within the bound).
    seconds_to_all_succeeded: float | None = None
    #: Log lines "listener connected" per worker: 2 or more means it listened again after the failover.
    listener_connects: list[int] = field(default_factory=list)
    #: A job enqueued once the workers listened again, from enqueue to SUCCEEDED: well under
    #: the workers' poll interval when a notification on the promoted server woke them.
    pickup_after_seconds: float | None = None
    #: Each worker's listener log lines (message, error), to tell why one did not listen again.
    listener_log: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0


class Producer(threading.Thread):
    """Enqueues its specs in batches, each retried with the same idempotency keys until acknowledged."""

    def __init__(self, engine: sqlalchemy.Engine, specs: list[rl.JobSpec]) -> None:
        super().__init__(name="failover-producer", daemon=True)
        self.engine = engine
        self.specs = specs
        self.lock = threading.Lock()
        self.acknowledged: list[Any] = []
        self.failures = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for start in range(0, len(self.specs), BATCH):
                batch = self.specs[start:start + BATCH]
                while not self.stop.is_set():
                    try:
                        ids = rl.enqueue_many_ids(self.engine, batch)
                    except rl.ConnectionFailed:
                        self.failures += 1
                        self.stop.wait(0.1)
                        continue
                    with self.lock:
                        self.acknowledged.extend(ids)
                    break
                self.stop.wait(BATCH_PAUSE_SECONDS)
        except BaseException as error:  # noqa: BLE001 - reported by the scenario
            self.error = error

    def acknowledged_now(self) -> set[Any]:
        with self.lock:
            return set(self.acknowledged)


def worker_settings(pair: ReplicatedPair, index: int) -> WorkerSettings:
    return WorkerSettings(
        url=pair.multi_host_url(DATABASE),
        # The handlers' side tables and plain SQLAlchemy engine take the query form of the same servers.
        observer_url=pair.multi_host_query_url(DATABASE),
        worker_id=f"failover-{index}",
        lease_ttl_seconds=10.0,
        heartbeat_interval_seconds=1.0,
        # Long, so a job picked up sooner after the failover shows a LISTEN on the promoted server.
        poll_interval_ms=POLL_INTERVAL_MS,
        reaper_interval_seconds=0.5,
        max_global_concurrency=4,
        claim_batch_size=8,
        job_types=[EFFECT],
        log_level="INFO",
    )


def run_failover(pair: ReplicatedPair, *, jobs: int = 3000, workers: int = 2, kill_fraction: float = 1 / 3,
                 effect_ms: int = 5, lag_seconds: float = 0.0) -> FailoverReport:
    """Run the scenario; ``lag_seconds``: how long the stream to the standby is held back before the kill."""
    began = time.monotonic()
    report = FailoverReport(jobs=jobs, synchronous=pair.synchronous, lag_seconds=lag_seconds)
    admin = sqlalchemy.create_engine(pair.url(pair.primary_port), isolation_level="AUTOCOMMIT",
                                     poolclass=sqlalchemy.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
    admin.dispose()
    engine = rl.create_engine(pair.multi_host_url(DATABASE), pool_size=4)
    db = Db(engine)
    rl.migrate(engine)
    db.create_side_tables()
    build_registry().sync_definitions(engine)
    specs = [rl.JobSpec(EFFECT, {"ms": effect_ms}, idempotency_key=f"failover-{n}") for n in range(jobs)]
    first, rest = specs[: jobs // 2], specs[jobs // 2:]
    ahead = rl.enqueue_many_ids(engine, first)
    producer = Producer(engine, rest)
    with WorkerFleet() as fleet:
        started = [fleet.start(worker_settings(pair, index)) for index in range(workers)]
        producer.start()
        _wait(lambda: db.count_status("SUCCEEDED") >= jobs * kill_fraction, 120, "a third of the jobs to succeed")
        if lag_seconds:
            # The standby falls behind by this long: the window asynchronous replication loses.
            pair.hold_replication()
            time.sleep(lag_seconds)
        # What the primary acknowledged, read just before it dies.
        acknowledged = set(ahead) | producer.acknowledged_now()
        succeeded_before = {row[0] for row in db.rows("SELECT id FROM job_queue WHERE status = 'SUCCEEDED'")}
        kill_at = db.now()
        report.wal_behind_bytes_at_kill = int(db.scalar(
            "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)), 0) FROM pg_stat_replication"))
        pair.kill_primary()
        pair.promote_standby()
        promoted = time.monotonic()
        # Work started before the promotion was in flight at the failover: nothing could start between.
        promoted_at = _retrying(db.now)
        report.succeeded_at_kill, report.acknowledged_at_kill = len(succeeded_before), len(acknowledged)
        producer.join(RECOVERY_BOUND_SECONDS)
        try:
            _wait(lambda: db.count_status("SUCCEEDED") == db.scalar("SELECT count(*) FROM job_queue"),
                  RECOVERY_BOUND_SECONDS - (time.monotonic() - promoted), "every job to succeed")
            report.seconds_to_all_succeeded = round(time.monotonic() - promoted, 1)
        except AssertionError:
            pass
        finally:
            producer.stop.set()
        report.statuses = db.status_counts()
        if report.seconds_to_all_succeeded is not None:
            report.pickup_after_seconds = _pickup_after_listening_again(engine, db, started)
        report.listener_connects = [worker.logged("listener connected") for worker in started]
        report.listener_log = [_listener_lines(worker) for worker in started]
    if producer.error is not None:
        raise producer.error
    present = {row[0] for row in db.rows("SELECT id FROM job_queue WHERE idempotency_key IS NOT NULL")}
    report.lost_enqueues = len(acknowledged - present)
    # A job ran after the kill when its successful attempt was leased after it, or its
    # handler's effect was recorded twice (a claim lost with the primary leaves one attempt row).
    ran_after_kill = {row[0] for row in db.rows(
        "SELECT job_id FROM job_attempts WHERE finished_at IS NOT NULL AND outcome IS NULL AND leased_at > :k",
        k=kill_at)}
    # A job gone altogether is a lost enqueue (counted above), not an outcome to write again.
    report.lost_outcomes = len(succeeded_before & ran_after_kill)
    first_runs = dict(db.rows("SELECT job_id, min(leased_at) FROM job_attempts GROUP BY job_id HAVING count(*) > 1"))
    first_runs.update(db.rows(
        "SELECT job_id, min(started_at) FROM fault_effects GROUP BY job_id HAVING count(*) > 1"))
    first_runs.update((job_id, None) for job_id in succeeded_before & ran_after_kill)
    report.reruns = len(first_runs)
    # Not in flight at the failover: first run after the promotion, or finished before the kill.
    report.reruns_not_in_flight = sum(1 for job_id, first in first_runs.items()
                                      if first is None or first > promoted_at)
    report.dead_lettered = db.scalar("SELECT count(*) FROM job_queue WHERE status = 'DEAD_LETTERED'")
    report.max_attempt = db.scalar("SELECT coalesce(max(attempt), 0) FROM job_queue")
    engine.dispose()
    report.seconds = round(time.monotonic() - began, 1)
    return report


def _pickup_after_listening_again(engine: sqlalchemy.Engine, db: Db, workers: list[Any]) -> float | None:
    try:
        _wait(lambda: all(worker.logged("listener connected") >= 2 for worker in workers), 60,
              "every worker to listen again")
    except AssertionError:
        return None
    # Idle now, each worker waits on its listener for up to the poll interval.
    db.execute("SELECT pg_sleep(0.5)")
    enqueued = time.monotonic()
    job = rl.enqueue(engine, EFFECT, {"ms": 0})
    _wait(lambda: db.scalar("SELECT status FROM job_queue WHERE id = :id", id=job.id) == "SUCCEEDED",
          POLL_INTERVAL_MS / 1000 * 3, "the job enqueued after the failover to succeed", interval=0.02)
    return round(time.monotonic() - enqueued, 2)


def _retrying(read: Any) -> Any:
    deadline = time.monotonic() + RECOVERY_BOUND_SECONDS
    while True:
        try:
            return read()
        except rl.ConnectionFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _listener_lines(worker: Any) -> list[str]:
    lines = []
    for line in list(worker.log_lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "listener" in str(record.get("message", "")):
            lines.append(f"{record.get('message')} {record.get('error', '')}".strip())
    return lines


def _wait(condition: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            if condition():
                return
        except rl.ConnectionFailed:
            pass  # the failover under way: ask again
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def text_report(report: FailoverReport) -> str:
    return "\n".join(f"{name}: {value}" for name, value in vars(report).items())

