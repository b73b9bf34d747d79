"""The fault scenarios of issue 6, shared by ``tests/faults`` (CI sizes) and ``bench/chaos.py`` (full sizes).

Each scenario sets up its database, runs real worker processes through one
fault, reads the outcome back from the rows and returns a :class:`ScenarioResult`:
the figures of the chaos table, details, and ``problems``, the expectations the
run broke. Tests assert ``problems == []`` and the key figures; the report
prints them. Sizes come from ``RUNLEDGER_FAULT_SCALE`` (:func:`sizes_from_env`).
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.db.embedded import EmbeddedPostgres
from tests.faults.fault_worker import (
    APP_WRITE,
    EFFECT,
    HANG,
    NOOP,
    PARTITION,
    SUICIDE,
    SUICIDE_MAX_ATTEMPTS,
    WorkerSettings,
    build_registry,
)
from tests.faults.harness import Db, TcpProxy, WorkerFleet, max_overlap
from tests.support import wait_until

SCALE_VARIABLE = "RUNLEDGER_FAULT_SCALE"
#: Extra time a bounded recovery may take on a loaded 2-core machine, beyond what the config implies.
RECOVERY_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class Sizes:
    churn_jobs: int
    #: Jobs per second the churn producer enqueues: below the fleet's capacity, so a
    #: recovered job waits for a free slot only, never behind a backlog.
    churn_rate: float
    churn_kill_every_seconds: float
    restart_jobs: int
    crash_jobs: int
    terminate_jobs: int
    concurrency_jobs: int
    concurrency_processes: int
    concurrency_threads: int
    hang_flowing_jobs: int
    soak_mark_jobs: int
    soak_total_jobs: int


CI_SIZES = Sizes(
    churn_jobs=400, churn_rate=40, churn_kill_every_seconds=1.5, restart_jobs=150, crash_jobs=1_500, terminate_jobs=150,
    concurrency_jobs=2_000, concurrency_processes=4, concurrency_threads=16, hang_flowing_jobs=20,
    soak_mark_jobs=2_000, soak_total_jobs=8_000,
)
FULL_SIZES = Sizes(
    churn_jobs=2_000, churn_rate=40, churn_kill_every_seconds=3.0, restart_jobs=1_000, crash_jobs=10_000,
    terminate_jobs=1_000,
    concurrency_jobs=20_000, concurrency_processes=4, concurrency_threads=16, hang_flowing_jobs=100,
    soak_mark_jobs=20_000, soak_total_jobs=100_000,
)


def sizes_from_env(environ: Optional[dict[str, str]] = None) -> Sizes:
    """``ci`` (the default) or ``full``; a number in (0, 1] scales the full job counts (never below CI's)."""
    value = (environ if environ is not None else os.environ).get(SCALE_VARIABLE, "ci").strip().lower() or "ci"
    if value == "ci":
        return CI_SIZES
    if value == "full":
        return FULL_SIZES
    fraction = float(value)
    if not 0 < fraction <= 1:
        raise ValueError(f"{SCALE_VARIABLE} must be ci, full or a fraction in (0, 1], got {value!r}")
    scaled = {
        name: max(getattr(CI_SIZES, name), round(getattr(FULL_SIZES, name) * fraction))
        for name in ("churn_jobs", "restart_jobs", "crash_jobs", "terminate_jobs", "concurrency_jobs", "hang_flowing_jobs",
                     "soak_mark_jobs", "soak_total_jobs")
    }
    return replace(FULL_SIZES, **scaled)


@dataclass
class ScenarioResult:
    scenario: str
    jobs: int
    lost: int
    duplicate_effects: Optional[int]
    duplicate_completions: int
    recovery_seconds: Optional[float]
    details: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.scenario}: jobs={self.jobs} lost={self.lost} duplicate_effects={self.duplicate_effects}"
                f" duplicate_completions={self.duplicate_completions} recovery_seconds={self.recovery_seconds}"
                f" details={self.details} problems={self.problems}")

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)


#: Short intervals so a fault resolves in seconds: a 2 s lease renewed every 0.5 s.
BASE_SETTINGS = WorkerSettings(
    url="", worker_id="fault", lease_ttl_seconds=2.0, heartbeat_interval_seconds=0.5, poll_interval_ms=50,
    reaper_interval_seconds=0.25, reaper_retry_delay_ms=1, max_global_concurrency=4, claim_batch_size=8,
)


def recovery_bound(settings: WorkerSettings) -> float:
    """The README's promise, lease TTL + reaper interval + one poll, plus slack for a loaded machine."""
    return (settings.lease_ttl_seconds + settings.reaper_interval_seconds + settings.poll_interval_ms / 1000.0
            + RECOVERY_SLACK_SECONDS)


def prepare(url: str) -> tuple[Any, Db]:
    engine = rl.create_engine(url)
    db = Db(engine)
    db.create_side_tables()
    build_registry().sync_definitions(engine)
    return engine, db


def enqueue(engine: Any, specs: list[rl.JobSpec], chunk: int = 5_000) -> None:
    for offset in range(0, len(specs), chunk):
        rl.enqueue_many(engine, specs[offset:offset + chunk])


def effect_specs(
    count: int, rng: random.Random, low_ms: int = 50, high_ms: int = 200, job_type: str = EFFECT
) -> list[rl.JobSpec]:
    return [rl.JobSpec(job_type, {"n": n, "ms": rng.randint(low_ms, high_ms)}) for n in range(count)]


def drain_seconds(jobs: int, jobs_per_second: float, minimum: float = 60.0) -> float:
    """A deadline for draining ``jobs`` that only a stuck run misses (a quarter of the expected speed)."""
    return max(minimum, 4 * jobs / jobs_per_second)


def outcome_figures(result: ScenarioResult, db: Db, job_type: str) -> None:
    """The checks every effect scenario shares: all SUCCEEDED once, every effect seen, nothing written twice."""
    counts = db.status_counts()
    result.details["statuses"] = counts
    succeeded = db.count_status("SUCCEEDED", job_type)
    result.lost = result.jobs - succeeded
    result.duplicate_effects = db.duplicate_effects()
    result.duplicate_completions = db.duplicate_completions()
    if result.lost:
        result.details["not_succeeded"] = [tuple(row) for row in db.rows(
            "SELECT id, status, attempt, last_error_code, last_error_message FROM job_queue"
            " WHERE job_type = :t AND status <> 'SUCCEEDED' LIMIT 5", t=job_type)]
        result.details["their_events"] = [tuple(row) for row in db.rows(
            "SELECT job_id, attempt, event_type, payload, occurred_at FROM job_events WHERE job_id IN"
            " (SELECT id FROM job_queue WHERE job_type = :t AND status <> 'SUCCEEDED' LIMIT 5) ORDER BY id",
            t=job_type)]
    result.expect(result.lost == 0, f"{result.lost} of {result.jobs} jobs did not end SUCCEEDED: {counts}")
    result.expect(result.duplicate_completions == 0, f"{result.duplicate_completions} outcomes were written twice")
    result.expect(db.success_rows_per_job_ok(), "a SUCCEEDED job does not have exactly one successful attempt row")
    missing = db.jobs_without_effect(job_type)
    result.expect(missing == 0, f"{missing} jobs have no effect row although their handler must have run")


def terminal_wait(db: Db, job_type: str, timeout: float, what: str) -> None:
    wait_until(lambda: db.unfinished(job_type) == 0, timeout, interval=0.2, what=what)


# -- 1. worker SIGKILL churn ---------------------------------------------------------------


@dataclass
class Kill:
    worker_id: str
    at: Any
    orphans: list[Any]


def worker_sigkill_churn(url: str, sizes: Sizes) -> ScenarioResult:
    """3 workers run 50-200 ms jobs fed at a steady rate; one is SIGKILLed every few seconds and restarted."""
    engine, db = prepare(url)
    result = ScenarioResult("worker SIGKILL churn", sizes.churn_jobs, 0, 0, 0, None)
    settings = replace(BASE_SETTINGS, url=url, max_global_concurrency=6, claim_batch_size=8, job_types=[EFFECT])
    specs = effect_specs(sizes.churn_jobs, random.Random(1))  # noqa: S311 - reproducible durations, not secrets
    batch = max(1, round(sizes.churn_rate / 10))
    produced = threading.Event()

    def produce() -> None:
        for offset in range(0, len(specs), batch):
            enqueue(engine, specs[offset:offset + batch])
            time.sleep(0.1)
        produced.set()

    kills: list[Kill] = []
    try:
        with WorkerFleet() as fleet:
            workers = [fleet.start(replace(settings, worker_id=f"churn{i}"), ready=False) for i in range(3)]
            for worker in workers:
                worker.wait_ready()
            producer = threading.Thread(target=produce, name="churn-producer", daemon=True)
            producer.start()
            started = time.monotonic()
            deadline = started + len(specs) / sizes.churn_rate + drain_seconds(len(specs), sizes.churn_rate)
            next_kill = started + sizes.churn_kill_every_seconds
            while not (produced.is_set() and db.unfinished(EFFECT) == 0):
                if time.monotonic() > deadline:
                    result.problems.append(f"churn did not drain: {db.status_counts()}")
                    break
                if time.monotonic() < next_kill:
                    time.sleep(0.05)
                    continue
                # The worker holding the most running jobs: on a loaded machine a worker
                # picked in turn may be one that has not claimed anything yet.
                leased = dict(db.rows(
                    "SELECT worker_id, count(*) FROM job_queue WHERE status = 'LEASED' AND worker_id = ANY(:ids)"
                    " GROUP BY worker_id", ids=[worker.worker_id for worker in workers]))
                slot = max(range(len(workers)), key=lambda i: (leased.get(workers[i].worker_id, 0),
                                                                (i - len(kills)) % len(workers) == 0))
                victim = workers[slot]
                # Read the clock before the kill, so recovery is measured from no later than the death.
                killed_at = db.now()
                victim.kill()
                orphans = [row[0] for row in db.rows(
                    "SELECT id FROM job_queue WHERE status = 'LEASED' AND worker_id = :w", w=victim.worker_id)]
                kills.append(Kill(victim.worker_id, killed_at, orphans))
                workers[slot] = fleet.start(replace(settings, worker_id=f"churn{slot}"))
                # Counted from the replacement's start: on a loaded machine a fixed cadence
                # would kill workers before they ever claimed anything.
                next_kill = time.monotonic() + sizes.churn_kill_every_seconds
            producer.join(30)
            result.details["elapsed_seconds"] = round(time.monotonic() - started, 1)
    finally:
        engine.dispose()
    engine = rl.create_engine(url)
    db = Db(engine)
    try:
        outcome_figures(result, db, EFFECT)
        recoveries = []
        unrecovered = 0
        for kill in kills:
            if not kill.orphans:
                continue
            relet = dict(db.rows(
                "SELECT job_id, min(occurred_at) FROM job_events WHERE event_type = 'LEASED'"
                " AND job_id = ANY(:ids) AND occurred_at > :t GROUP BY job_id",
                ids=kill.orphans, t=kill.at,
            ))
            unrecovered += len(set(kill.orphans) - set(relet))
            recoveries += [(when - kill.at).total_seconds() for when in relet.values()]
        bound = recovery_bound(settings)
        result.recovery_seconds = round(max(recoveries), 2) if recoveries else None
        result.details.update(
            kills=len(kills), kills_that_hit_jobs=sum(bool(k.orphans) for k in kills),
            orphaned_jobs=sum(len(k.orphans) for k in kills), recovery_bound_seconds=round(bound, 2),
            recovery_p50_seconds=round(sorted(recoveries)[len(recoveries) // 2], 2) if recoveries else None,
        )
        result.expect(any(k.orphans for k in kills), f"none of the {len(kills)} kills hit a running job")
        result.expect(unrecovered == 0, f"{unrecovered} orphaned jobs were never leased again")
        result.expect(result.recovery_seconds is None or result.recovery_seconds <= bound,
                      f"a killed worker's job took {result.recovery_seconds} s to restart (bound {bound:.2f} s)")
    finally:
        engine.dispose()
    return result


# -- 2. PostgreSQL restart / terminated backends ------------------------------------------


def _first_success_after(db: Db, at: Any) -> Any:
    return db.scalar("SELECT min(occurred_at) FROM job_events WHERE event_type = 'SUCCEEDED' AND occurred_at > :t",
                     t=at)


def _database_fault_run(
    url: str, jobs: int, name: str, faults: list[Any], reconnect: Any = None, job_type: str = EFFECT,
    settings: WorkerSettings = BASE_SETTINGS, durations_ms: tuple[int, int] = (50, 150),
    before_fault: Any = None,
) -> ScenarioResult:
    """Run ``jobs`` effect jobs on 2 workers; at 30 % and 60 % done, the next of ``faults`` breaks the database.

    Each fault returns the database time from which the workers must resume.
    Workers are never restarted. ``before_fault`` is called with the Db just before each fault.
    """
    engine, db = prepare(url)
    result = ScenarioResult(name, jobs, 0, 0, 0, None)
    settings = replace(settings, url=url, job_types=[job_type])
    enqueue(engine, effect_specs(jobs, random.Random(2), *durations_ms, job_type))  # noqa: S311 - durations
    resumes: list[float] = []
    try:
        with WorkerFleet() as fleet:
            workers = [fleet.start(replace(settings, worker_id=f"db{i}"), ready=False) for i in range(2)]
            for worker in workers:
                worker.wait_ready()
            pids = [worker.pid for worker in workers]
            for share, fault in zip((0.3, 0.6), faults, strict=True):
                wait_until(lambda db=db, share=share: db.count_status("SUCCEEDED", job_type) >= jobs * share,
                           drain_seconds(jobs, 20), what=f"{name}: {share:.0%} of the jobs done")
                if before_fault is not None:
                    before_fault(db)
                resume_from = fault()
                if reconnect is not None:
                    engine.dispose()
                    engine = reconnect()
                    db = Db(engine)
                first = wait_until(lambda db=db, at=resume_from: _first_success_after(db, at), 30,
                                   what=f"{name}: a job finishing after the fault")
                resumes.append((first - resume_from).total_seconds())
            terminal_wait(db, job_type, drain_seconds(jobs, 20), f"{name}: every job finished")
            alive = [worker.alive() for worker in workers]
            result.details["worker_pids"] = pids
            result.expect(all(alive), f"a worker process died during the fault (alive: {alive})")
            result.details["lease_losses_logged"] = sum(
                worker.logged("job heartbeat lost lease ownership")
                + worker.logged("aborting job because lease heartbeat could not be persisted") for worker in workers)
        outcome_figures(result, db, job_type)
        result.recovery_seconds = round(max(resumes), 2)
        result.details["resume_seconds"] = [round(r, 2) for r in resumes]
        # Reconnecting takes a pool ping and a retry; a lease only matters for jobs cut mid-flight.
        bound = 10.0
        result.expect(result.recovery_seconds <= bound,
                      f"workers took {result.recovery_seconds} s to finish a job after the fault (bound {bound} s)")
    finally:
        engine.dispose()
    return result


class RestartableServer:
    """A dedicated embedded server with a migrated database, stopped and started again on demand."""

    def __init__(self, data_dir: str | Path, down_seconds: float = 1.0) -> None:
        self.data = Path(data_dir) / "pgdata"
        self.down_seconds = down_seconds
        self.server = EmbeddedPostgres(self.data).start()
        self.url = self.server.create_database("fault_restart")
        migrator = rl.create_engine(self.url)
        rl.migrate(migrator)
        migrator.dispose()
        self.downtimes: list[float] = []

    def restart(self, *, immediate: bool = False) -> Any:
        """Stop the server, wait, start it again; return the database time it serves from.

        ``immediate``: stop it as a crash would, so commits that did not wait for the disk may be lost.
        """
        stopped_at = time.monotonic()
        self.server.stop(immediate=immediate)
        time.sleep(self.down_seconds)
        self.server = EmbeddedPostgres(self.data).start()
        self.downtimes.append(round(time.monotonic() - stopped_at, 2))
        probe = rl.create_engine(self.url)
        try:
            return Db(probe).now()
        finally:
            probe.dispose()

    def crash(self) -> Any:
        return self.restart(immediate=True)

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.data, ignore_errors=True)


class BackendTerminator:
    """``pg_terminate_backend`` on every other connection to the database, counting them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.killed: list[int] = []

    def __call__(self) -> Any:
        # A fresh engine each time: a server restart may have come in between.
        admin = rl.create_engine(self.url)
        try:
            db = Db(admin)
            at = db.now()
            pids = db.backend_pids()
            for pid in pids:
                db.scalar("SELECT pg_terminate_backend(:pid)", pid=pid)
            self.killed.append(len(pids))
            return at
        finally:
            admin.dispose()


def postgres_restart(data_dir: str | Path, sizes: Sizes, down_seconds: float = 1.0) -> ScenarioResult:
    """A dedicated embedded server is stopped and started again on the same data directory, twice, mid-run."""
    server = RestartableServer(data_dir, down_seconds)
    try:
        result = _database_fault_run(server.url, sizes.restart_jobs, "PostgreSQL restart",
                                     [server.restart, server.restart], reconnect=lambda: rl.create_engine(server.url))
        result.details["downtime_seconds"] = server.downtimes
        return result
    finally:
        server.close()


#: The spec's defaults (32 slots, claims of 16), short jobs so claims go out all the time, and a
#: lease longer than any outage here: no lease runs out, so a job run twice at once could only
#: come from a claim or running write that a crash undid.
CRASH_SETTINGS = replace(BASE_SETTINGS, max_global_concurrency=32, claim_batch_size=16, lease_ttl_seconds=15.0,
                         heartbeat_interval_seconds=1.0)


def postgres_crash(data_dir: str | Path, sizes: Sizes) -> ScenarioResult:
    """The server is stopped as a crash would (``pg_ctl -m immediate``) and started again, twice, mid-run.

    The claim commits without waiting for the disk; only the running write that
    follows it in the same round trip does. A crash can lose claims, never a
    started one: no handler may run on a claim the crash undid, nor twice at once,
    and each job's attempts must be counted as the rows show them.
    """
    server = RestartableServer(data_dir, down_seconds=0.2)
    leased_at_crash: list[int] = []
    try:
        result = _database_fault_run(
            server.url, sizes.crash_jobs, "PostgreSQL crash", [server.crash, server.crash],
            reconnect=lambda: rl.create_engine(server.url), settings=CRASH_SETTINGS, durations_ms=(5, 30),
            before_fault=lambda db: leased_at_crash.append(db.count_status("LEASED")),
        )
        result.details["downtime_seconds"] = server.downtimes
        result.details["leased_at_crash"] = leased_at_crash
        result.expect(all(leased_at_crash), f"a crash came while no job was leased: {leased_at_crash}")
        engine = rl.create_engine(server.url)
        try:
            attempt_figures(result, Db(engine))
        finally:
            engine.dispose()
        return result
    finally:
        server.close()


def attempt_figures(result: ScenarioResult, db: Db) -> None:
    """No handler ran twice at once or on an unpersisted claim, and every job's attempt count matches its rows."""
    # One handler run per (job, attempt, worker, start): an effect row whose insert
    # the crash answered late is written again by the same run, not by another one.
    overlapping = db.scalar(
        "WITH runs AS (SELECT job_id, attempt, worker_id, started_at, min(finished_at) AS finished_at"
        " FROM fault_effects GROUP BY job_id, attempt, worker_id, started_at)"
        " SELECT count(*) FROM runs a JOIN runs b ON a.job_id = b.job_id"
        " AND (a.attempt, a.worker_id, a.started_at) < (b.attempt, b.worker_id, b.started_at)"
        " WHERE a.started_at < b.finished_at AND b.started_at < a.finished_at")
    unpersisted = db.scalar(
        "SELECT count(*) FROM fault_effects e JOIN job_queue q ON q.id = e.job_id"
        " LEFT JOIN job_attempts a ON (a.job_id, a.run_number, a.attempt) = (e.job_id, q.run_number, e.attempt)"
        " WHERE a.execution_started_persisted_at IS NULL OR a.execution_started_persisted_at > e.started_at")
    miscounted = db.scalar(
        "SELECT count(*) FROM job_queue q CROSS JOIN LATERAL (SELECT count(*) AS n, max(a.attempt) AS top"
        " FROM job_attempts a WHERE a.job_id = q.id AND a.run_number = q.run_number) a"
        " WHERE a.n <> q.attempt OR a.top IS DISTINCT FROM nullif(q.attempt, 0)")
    never_started = db.scalar("SELECT count(*) FROM job_attempts WHERE execution_started_persisted_at IS NULL")
    result.details.update(
        handlers_overlapping=overlapping, handlers_on_unpersisted_claims=unpersisted,
        jobs_with_miscounted_attempts=miscounted, attempts_never_started=never_started,
        overlapping_live_claims=db.overlapping_live_claims(),
        attempts=db.scalar("SELECT count(*) FROM job_attempts"),
    )
    result.expect(overlapping == 0, f"{overlapping} pairs of one job's handlers ran at the same time")
    result.expect(unpersisted == 0, f"{unpersisted} handlers ran on an attempt whose RUNNING was not persisted first")
    result.expect(miscounted == 0, f"{miscounted} jobs' attempt numbers do not match their attempt rows")
    result.expect(never_started == 0, f"{never_started} attempt rows of finished jobs never started")
    result.expect(result.details["overlapping_live_claims"] == 0, "two workers held live leases on one job at once")


def terminate_backends(url: str, sizes: Sizes) -> ScenarioResult:
    """``pg_terminate_backend`` on every worker connection, twice, mid-run."""
    terminate = BackendTerminator(url)
    result = _database_fault_run(url, sizes.terminate_jobs, "pg_terminate_backend", [terminate, terminate])
    result.details["backends_terminated"] = terminate.killed
    result.expect(all(count > 0 for count in terminate.killed), f"no worker backend was terminated: {terminate.killed}")
    return result


def restart_under_app_writes(data_dir: str | Path, sizes: Sizes) -> ScenarioResult:
    """Handlers write through the application's own engine, without retrying; the server restarts, then
    every backend is terminated. No job may be dead-lettered: the handlers' errors are transient."""
    server = RestartableServer(data_dir)
    terminate = BackendTerminator(server.url)
    try:
        result = _database_fault_run(server.url, sizes.restart_jobs, "restart under app writes",
                                     [server.restart, terminate], reconnect=lambda: rl.create_engine(server.url),
                                     job_type=APP_WRITE)
        result.details["downtime_seconds"] = server.downtimes
        result.details["backends_terminated"] = terminate.killed
        with_retries = Db(rl.create_engine(server.url))
        try:
            result.details["transient_retries"] = with_retries.scalar(
                "SELECT count(*) FROM job_attempts WHERE error_code = 'job.handler_transient_error'")
            result.expect(with_retries.count_status("DEAD_LETTERED") == 0, "a job was dead-lettered")
        finally:
            with_retries.engine.dispose()
        return result
    finally:
        server.close()


# -- 3. network cut ----------------------------------------------------------------------


@dataclass
class CutResult:
    result: ScenarioResult
    #: Seconds from the cut to the victim's cancellation flag (database clock), or None if never set.
    cancelled_after_cut: Optional[float]
    cancelled_during_cut: bool


def network_cut(url: str, cut_seconds: float = 6.0) -> CutResult:
    """A worker behind a TCP proxy loses the network for longer than its lease while running a job."""
    engine, db = prepare(url)
    result = ScenarioResult("network cut", 1, 0, 0, 0, None)
    rl.enqueue(engine, PARTITION, {})
    proxy = TcpProxy(url)
    settings = replace(BASE_SETTINGS, url=url, max_global_concurrency=1, claim_batch_size=1, job_types=[PARTITION])
    cancelled_after = None
    cancelled_during = False
    try:
        with WorkerFleet() as fleet:
            victim = fleet.start(replace(settings, worker_id="cutoff", url=proxy.url_for(url), observer_url=url,
                                         partition_role="victim", run_reaper=False))
            wait_until(lambda: db.scalar("SELECT count(*) FROM fault_notes WHERE note = 'victim running'"), 30,
                       what="the victim started the job")
            wait_until(lambda: db.scalar("SELECT count(*) FROM job_events WHERE event_type = 'HEARTBEAT'"), 10,
                       what="the victim renews its lease")
            # Started (and idle) before the cut, so recovery is not measured from a process start.
            rescuer = fleet.start(replace(settings, worker_id="rescuer"))
            cut_at = db.now()
            cut_started = time.monotonic()
            proxy.cut()
            wait_until(lambda: db.count_status("SUCCEEDED") == 1, cut_seconds + 10, what="the rescuer finished the job")
            result.expect(proxy.is_cut and time.monotonic() - cut_started < cut_seconds,
                          "the job was only finished after the network came back")
            succeeded_at = db.scalar("SELECT occurred_at FROM job_events WHERE event_type = 'SUCCEEDED'")
            result.recovery_seconds = round((succeeded_at - cut_at).total_seconds(), 2)
            time.sleep(max(0.0, cut_seconds - (time.monotonic() - cut_started)))
            healed_at = db.now()
            proxy.heal()
            wait_until(lambda: db.scalar("SELECT count(*) FROM fault_notes WHERE note LIKE 'late completion%'"), 20,
                       what="the cut-off worker tried its late completion")
            notes = db.rows("SELECT note, at FROM fault_notes WHERE worker_id = :w ORDER BY at", w=victim.worker_id)
            result.details["victim_notes"] = [note for note, _ in notes]
            cancelled = [at for note, at in notes if note.startswith("victim cancelled:")]
            if cancelled:
                cancelled_after = round((cancelled[0] - cut_at).total_seconds(), 2)
                cancelled_during = cancelled[0] < healed_at
            result.details.update(cancelled_after_cut_seconds=cancelled_after, cancelled_during_cut=cancelled_during,
                                  proxied_connections=proxy.connections, rescuer=rescuer.worker_id)
            result.expect("victim cancelled:lease_lost" in result.details["victim_notes"],
                          "the cut-off worker's cancellation flag was not set for a lost lease")
            result.expect("late completion refused:job.lease_owner_mismatch" in result.details["victim_notes"],
                          "the cut-off worker's late completion was not refused with job.lease_owner_mismatch")
            job = db.rows("SELECT status, attempt FROM job_queue")[0]
            attempts = db.rows("SELECT attempt, worker_id, outcome, finished_at IS NOT NULL FROM job_attempts"
                               " ORDER BY attempt")
            result.details["attempts"] = [tuple(row) for row in attempts]
            result.expect(tuple(job) == ("SUCCEEDED", 2), f"job row is {tuple(job)}, expected SUCCEEDED at attempt 2")
            result.expect(
                [tuple(row) for row in attempts]
                == [(1, victim.worker_id, "LEASE_EXPIRED", True), (2, rescuer.worker_id, None, True)],
                f"attempt rows are {result.details['attempts']}")
            result.duplicate_effects = db.duplicate_effects()
            result.duplicate_completions = db.duplicate_completions()
            result.lost = 1 - db.count_status("SUCCEEDED")
            result.expect(result.duplicate_completions == 0, "an outcome was written twice")
            result.expect(result.duplicate_effects == 0, "the job's effect was recorded twice")
    finally:
        proxy.close()
        engine.dispose()
    return CutResult(result, cancelled_after, cancelled_during)


# -- 4. concurrency -------------------------------------------------------------------------


def concurrency(url: str, sizes: Sizes) -> ScenarioResult:
    """N processes x M threads drain a pre-inserted queue; nothing is claimed twice or lost."""
    engine, db = prepare(url)
    jobs = sizes.concurrency_jobs
    result = ScenarioResult(f"concurrency {sizes.concurrency_processes}x{sizes.concurrency_threads}", jobs, 0, 0, 0,
                            None)
    enqueue(engine, [rl.JobSpec(EFFECT, {"n": n, "ms": 0}) for n in range(jobs)])
    settings = replace(BASE_SETTINGS, url=url, lease_ttl_seconds=5.0, heartbeat_interval_seconds=None,
                       max_global_concurrency=sizes.concurrency_threads, claim_batch_size=sizes.concurrency_threads,
                       job_types=[EFFECT], max_overflow=2)
    try:
        with WorkerFleet() as fleet:
            for n in range(sizes.concurrency_processes):
                fleet.start(replace(settings, worker_id=f"conc{n}"), ready=False)
            terminal_wait(db, EFFECT, drain_seconds(jobs, 100), "concurrency: every job finished")
        outcome_figures(result, db, EFFECT)
        overlapping = db.overlapping_live_claims()
        relet = db.scalar("SELECT count(*) FROM (SELECT job_id FROM job_events WHERE event_type = 'LEASED'"
                          " GROUP BY job_id HAVING count(*) > 1) r")
        first, last = db.rows("SELECT (SELECT min(occurred_at) FROM job_events WHERE event_type = 'LEASED'),"
                              " (SELECT max(occurred_at) FROM job_events WHERE event_type = 'SUCCEEDED')")[0]
        seconds = (last - first).total_seconds()
        result.details.update(overlapping_live_claims=overlapping, jobs_leased_more_than_once=relet,
                              drain_seconds=round(seconds, 1), jobs_per_second=round(jobs / seconds, 1),
                              workers=db.scalar("SELECT count(DISTINCT worker_id) FROM job_attempts"))
        result.expect(overlapping == 0, f"{overlapping} pairs of attempts held one job at the same time")
        # No fault here: a second lease or a second effect can only be a double claim.
        result.expect(relet == 0, f"{relet} jobs were leased more than once without any fault")
        result.expect(result.duplicate_effects == 0, f"{result.duplicate_effects} effects ran twice without any fault")
        result.expect(result.details["workers"] == sizes.concurrency_processes,
                      f"only {result.details['workers']} of {sizes.concurrency_processes} workers claimed jobs")
    finally:
        engine.dispose()
    return result


# -- 5. poison jobs ---------------------------------------------------------------------------


def poison_suicide(url: str) -> ScenarioResult:
    """A handler that SIGKILLs its own process, every time; the worker is restarted after each death."""
    engine, db = prepare(url)
    result = ScenarioResult("poison: handler kills its process", 1, 0, None, 0, None)
    job = rl.enqueue(engine, SUICIDE, {})
    settings = replace(BASE_SETTINGS, url=url, job_types=[SUICIDE])
    deaths = 0
    try:
        with WorkerFleet() as fleet:
            worker = fleet.start(replace(settings, worker_id="poison"), ready=False)
            deadline = time.monotonic() + (SUICIDE_MAX_ATTEMPTS + 2) * (recovery_bound(settings) + 5)
            while db.count_status("DEAD_LETTERED") == 0 and time.monotonic() < deadline:
                if not worker.alive():
                    deaths += 1
                    worker = fleet.start(replace(settings, worker_id="poison"), ready=False)
                time.sleep(0.05)
            # The job is dead: the worker that reaped it must now stay up and leave it alone.
            time.sleep(recovery_bound(settings))
            survivor_alive = worker.alive()
        row = db.rows("SELECT status, attempt, last_error_code FROM job_queue WHERE id = :id", id=job.id)[0]
        attempts = [tuple(r) for r in db.rows(
            "SELECT attempt, outcome, error_code FROM job_attempts WHERE job_id = :id ORDER BY attempt", id=job.id)]
        leased = db.scalar("SELECT count(*) FROM job_events WHERE job_id = :id AND event_type = 'LEASED'", id=job.id)
        suicides = db.scalar("SELECT count(*) FROM fault_notes WHERE note = 'suicide'")
        dead_letter = db.scalar("SELECT count(*) FROM job_dead_letters WHERE job_id = :id", id=job.id)
        result.details.update(job=tuple(row), attempts=attempts, deaths=deaths, leases=leased, handler_runs=suicides)
        result.lost = 0 if row[0] == "DEAD_LETTERED" else 1
        result.duplicate_completions = db.duplicate_completions()
        expected = [(n, "LEASE_EXPIRED", "job.lease_expired") for n in range(1, SUICIDE_MAX_ATTEMPTS + 1)]
        result.expect(tuple(row) == ("DEAD_LETTERED", SUICIDE_MAX_ATTEMPTS, "job.lease_expired"),
                      f"job row is {tuple(row)}")
        result.expect(attempts == expected, f"attempt rows are {attempts}")
        result.expect(deaths == suicides == leased == SUICIDE_MAX_ATTEMPTS,
                      f"{deaths} deaths, {suicides} handler runs, {leased} leases; expected {SUICIDE_MAX_ATTEMPTS} each")
        result.expect(dead_letter == 1, "no job_dead_letters row")
        result.expect(survivor_alive, "the worker that dead-lettered the job died too")
    finally:
        engine.dispose()
    return result


def poison_hang(url: str, sizes: Sizes, concurrency: int = 3) -> ScenarioResult:
    """A handler that never returns and ignores cancellation, among jobs that must keep flowing."""
    engine, db = prepare(url)
    flowing = sizes.hang_flowing_jobs
    result = ScenarioResult("poison: handler never returns", flowing, 0, 0, 0, None)
    # Higher priority: the hang is claimed first and holds its slot for the whole run.
    hang = rl.enqueue(engine, HANG, {}, priority=1_000)
    enqueue(engine, effect_specs(flowing, random.Random(5), 100, 200))  # noqa: S311 - durations
    settings = replace(BASE_SETTINGS, url=url, max_global_concurrency=concurrency, claim_batch_size=concurrency,
                       job_types=[HANG, EFFECT])
    try:
        with WorkerFleet() as fleet:
            worker = fleet.start(replace(settings, worker_id="hang"), ready=False)
            terminal_wait(db, None, drain_seconds(flowing, 5), "hang: every job finished")
            still_hanging = db.scalar("SELECT count(*) FROM fault_notes WHERE note = 'hang returned'") == 0
            alive = worker.alive()
            # A drain would wait for the hung thread, which never ends.
            worker.kill()
        outcome_figures(result, db, EFFECT)
        # The hung job counts too: it must end (dead-lettered by its timeout), not stay LEASED.
        result.jobs += 1
        result.lost += 0 if db.count_status("DEAD_LETTERED", HANG) == 1 else 1
        row = tuple(db.rows("SELECT status, last_error_code FROM job_queue WHERE id = :id", id=hang.id)[0])
        peak = max_overlap([tuple(r) for r in db.rows("SELECT started_at, finished_at FROM fault_effects")])
        result.details.update(hang_job=row, peak_parallel_other_jobs=peak, concurrency=concurrency)
        result.expect(row == ("DEAD_LETTERED", "job.timeout_exceeded"), f"the hung job's row is {row}")
        result.expect(still_hanging, "the hung handler returned: the scenario did not hold a slot")
        result.expect(alive, "the worker process died")
        result.expect(peak == concurrency - 1,
                      f"other jobs ran {peak} at a time; the hung handler should hold exactly its own one of "
                      f"{concurrency} slots")
    finally:
        engine.dispose()
    return result


# -- 8. memory soak --------------------------------------------------------------------------


def memory_soak(url: str, sizes: Sizes, limit: float = 0.10) -> ScenarioResult:
    """No-op jobs through one worker process; its RSS at the mark and at the end differ by < ``limit``."""
    engine, db = prepare(url)
    total, mark = sizes.soak_total_jobs, sizes.soak_mark_jobs
    result = ScenarioResult("memory soak", total, 0, None, 0, None)
    enqueue(engine, [rl.JobSpec(NOOP, {"n": n}) for n in range(total)])
    settings = replace(BASE_SETTINGS, url=url, lease_ttl_seconds=10.0, heartbeat_interval_seconds=None,
                       max_global_concurrency=16, claim_batch_size=16, job_types=[NOOP], rss_marks=[mark, total])
    try:
        with WorkerFleet() as fleet:
            worker = fleet.start(replace(settings, worker_id="soak"))
            started = time.monotonic()
            at_mark = worker.wait_event(lambda e: e.get("jobs") == mark, drain_seconds(mark, 100))
            at_end = worker.wait_event(lambda e: e.get("jobs") == total, drain_seconds(total, 100))
            terminal_wait(db, NOOP, 60, "soak: every job finished")
            elapsed = time.monotonic() - started
        result.lost = total - db.count_status("SUCCEEDED", NOOP)
        growth = (at_end["rss_kb"] - at_mark["rss_kb"]) / at_mark["rss_kb"]
        result.details.update(rss_mib_at_mark=round(at_mark["rss_kb"] / 1024, 1),
                              rss_mib_at_end=round(at_end["rss_kb"] / 1024, 1),
                              growth_percent=round(100 * growth, 1), mark_jobs=mark,
                              jobs_per_second=round(total / elapsed, 1))
        result.expect(result.lost == 0, f"{result.lost} jobs did not succeed")
        result.expect(abs(growth) < limit, f"RSS changed by {100 * growth:.1f} % between {mark} and {total} jobs")
    finally:
        engine.dispose()
    return result
