"""Flow control's limits hold across two worker processes of 8 slots each, on the database's clock.

Each test starts two real worker processes (:mod:`tests.flow_app`), enqueues
under load and reads back what ran: every handler records its start and end
with ``clock_timestamp()`` in ``flow_runs``, and every claim stamps its
attempt's ``leased_at`` with the claim's own clock. The limits checked are the
queue settings of :func:`tests.flow_app.build_registry`: key_limit 1, a global
limit of 3, a rate of 20 per second, and a pause; then a worker killed while it
holds a key's job, and the keys and the global limit again behind PgBouncer in
transaction pooling.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import text

import runledger_sync as rl
from tests.db.pooling.conftest import pgbouncer, pgbouncer_executable  # noqa: F401 - fixtures used below
from tests.faults.harness import max_overlap
from tests.flow_app import (
    CAPPED,
    CAPPED_QUEUE,
    GLOBAL_LIMIT,
    HOLD,
    KEYED,
    PAUSABLE,
    PAUSABLE_QUEUE,
    RATE_COUNT,
    RATE_SECONDS,
    RATED,
    RATED_QUEUE,
    RUNS_DDL,
    FlowWorkerSettings,
    build_registry,
)
from tests.support import rows, scalar, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
SLOTS = 8
#: Beyond lease + reaper interval + poll, for a loaded 2-core machine.
RECOVERY_SLACK_SECONDS = 2.0


class FlowWorker:
    """One ``tests.flow_app`` process; its stdout and stderr go to files (a pipe could fill up)."""

    def __init__(self, settings: FlowWorkerSettings, directory: Path) -> None:
        self.settings = settings
        self.out_path = directory / f"{settings.worker_id}.out"
        self.log_path = directory / f"{settings.worker_id}.log"
        with self.out_path.open("w") as out, self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.flow_app", settings.to_json()], stdout=out, stderr=log,
                cwd=str(REPO_ROOT), env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            )

    def ready(self) -> bool:
        assert self.process.poll() is None, f"worker {self.settings.worker_id} exited: {self.log_tail()}"
        return '"ready"' in self.out_path.read_text()

    def log_tail(self) -> str:
        return "".join(self.log_path.read_text().splitlines(keepends=True)[-20:])

    def claim_failures(self) -> list[str]:
        return [line for line in self.log_path.read_text().splitlines() if "worker claim failed" in line]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Flow:
    """A scenario's database (direct engine), its worker processes, and the reads of what ran."""

    def __init__(self, url: str, engine: Any, directory: Path) -> None:
        self.url = url
        self.engine = engine
        self.directory = directory
        self.workers: list[FlowWorker] = []
        self._names = itertools.count(1)

    def start_workers(self, count: int = WORKERS, **settings: Any) -> list[FlowWorker]:
        settings.setdefault("url", self.url)
        started = [
            FlowWorker(FlowWorkerSettings(worker_id=f"flow-{next(self._names)}", observer_url=self.url,
                                          concurrency=SLOTS, **settings), self.directory)
            for _ in range(count)
        ]
        self.workers += started
        for worker in started:
            wait_until(worker.ready, timeout=30, what=f"{worker.settings.worker_id} ready")
        return started

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()

    def now(self) -> Any:
        return scalar(self.engine, "SELECT clock_timestamp()")

    def succeeded(self, job_type: str) -> int:
        return scalar(self.engine, "SELECT count(*) FROM job_queue WHERE job_type = :t AND status = 'SUCCEEDED'",
                      t=job_type)

    def wait_succeeded(self, job_type: str, count: int, timeout: float) -> None:
        def done() -> bool:
            for worker in self.workers:
                if worker.process.poll() is not None and worker.process.returncode != -signal.SIGKILL:
                    raise AssertionError(f"{worker.settings.worker_id} exited: {worker.log_tail()}")
            return self.succeeded(job_type) == count

        try:
            wait_until(done, timeout=timeout, interval=0.05, what=f"{count} {job_type} jobs succeeded")
        except AssertionError:
            statuses = rows(self.engine, "SELECT status, count(*) FROM job_queue WHERE job_type = :t GROUP BY status",
                            t=job_type)
            raise AssertionError(f"{job_type}: {statuses}; logs: {[w.log_tail() for w in self.workers]}") from None

    def runs(self, job_type: str) -> list[Any]:
        return rows(self.engine, "SELECT * FROM flow_runs WHERE job_type = :t ORDER BY started_at, id", t=job_type)

    def claims(self, queue: str) -> list[Any]:
        """Every attempt of the queue's jobs: its claim (``leased_at``) and its end, in claim order."""
        return rows(self.engine, "SELECT a.job_id, a.attempt, a.worker_id, a.leased_at, a.finished_at"
                                 " FROM job_attempts a JOIN job_queue q ON q.id = a.job_id WHERE q.queue = :q"
                                 " ORDER BY a.leased_at", q=queue)

    def assert_no_claim_failed(self) -> None:
        assert [line for worker in self.workers for line in worker.claim_failures()] == []


@pytest.fixture
def flow(fresh_database, tmp_path) -> Iterator[Flow]:
    engine = rl.create_engine(fresh_database)
    with engine.begin() as conn:
        conn.execute(text(RUNS_DDL))
    build_registry().sync_definitions(engine)
    scenario = Flow(fresh_database, engine, tmp_path)
    try:
        yield scenario
    finally:
        scenario.stop_all()
        engine.dispose()


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def enqueue_keyed(engine: Any, keys: int, per_key: int, ms: int) -> None:
    """One enqueue call per job, keys interleaved, so each key's enqueue order is its jobs' ``seq``."""
    for seq in range(per_key):
        for key in range(keys):
            rl.enqueue(engine, KEYED, {"key": f"k{key}", "seq": seq, "ms": ms}, concurrency_key=f"k{key}")


def assert_keys_serial_in_order(flow: Flow, keys: int, per_key: int) -> None:
    """Each key's runs: one at a time, in enqueue order, each job once; its claims never overlap either."""
    by_key: dict[str, list[Any]] = defaultdict(list)
    for run in flow.runs(KEYED):
        by_key[run.concurrency_key].append(run)
    assert len(by_key) == keys
    for key, runs in by_key.items():
        assert [run.seq for run in runs] == list(range(per_key)), f"key {key} started out of enqueue order"
        assert all(run.attempt == 1 and run.finished_at is not None for run in runs)
        for earlier, later in itertools.pairwise(runs):
            assert earlier.finished_at < later.started_at, f"key {key}: seq {earlier.seq} and {later.seq} overlap"
    claims_by_key: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for claim in rows(flow.engine, "SELECT q.execution_resource_key AS k, a.leased_at, a.finished_at FROM job_attempts a"
                                   " JOIN job_queue q ON q.id = a.job_id WHERE q.job_type = :t", t=KEYED):
        claims_by_key[claim.k].append((claim.leased_at, claim.finished_at))
    assert {key: max_overlap(claims) for key, claims in claims_by_key.items()} == dict.fromkeys(by_key, 1)


@pytest.mark.timeout(90)
def test_key_limit_1_runs_each_keys_jobs_one_at_a_time_in_enqueue_order(flow):
    flow.start_workers()
    enqueue_keyed(flow.engine, keys=10, per_key=12, ms=40)
    flow.wait_succeeded(KEYED, 120, timeout=45)
    assert_keys_serial_in_order(flow, keys=10, per_key=12)
    assert len({run.worker_id for run in flow.runs(KEYED)}) == WORKERS
    flow.assert_no_claim_failed()


def assert_global_limit_held_and_reached(flow: Flow, job_type: str, queue: str) -> None:
    runs = flow.runs(job_type)
    assert max_overlap([(run.started_at, run.finished_at) for run in runs]) == GLOBAL_LIMIT
    assert max_overlap([(claim.leased_at, claim.finished_at) for claim in flow.claims(queue)]) == GLOBAL_LIMIT


@pytest.mark.timeout(90)
def test_global_limit_3_never_has_more_than_3_running_across_both_workers_and_reaches_3(flow):
    flow.start_workers()
    rl.enqueue_many(flow.engine, [rl.JobSpec(CAPPED, {"ms": 100}) for _ in range(30)])
    flow.wait_succeeded(CAPPED, 30, timeout=45)
    assert_global_limit_held_and_reached(flow, CAPPED, CAPPED_QUEUE)
    flow.assert_no_claim_failed()


@pytest.mark.timeout(90)
def test_rate_20_per_second_never_claims_more_than_20_in_any_second(flow):
    jobs = 100
    flow.start_workers()
    rl.enqueue_many(flow.engine, [rl.JobSpec(RATED, {"ms": 5}) for _ in range(jobs)])
    flow.wait_succeeded(RATED, jobs, timeout=45)
    claims = [claim.leased_at for claim in flow.claims(RATED_QUEUE)]
    assert len(claims) == jobs
    window = timedelta(seconds=RATE_SECONDS)
    # The claim's rule, for every claim: at most RATE_COUNT in the window (t - 1 s, t].
    busiest = max(sum(1 for other in claims if at - window < other <= at) for at in claims)
    assert busiest == RATE_COUNT
    assert seconds(claims[-1] - claims[0]) >= (jobs / RATE_COUNT - 1) * RATE_SECONDS
    starts = [run.started_at for run in flow.runs(RATED)]
    print(f"claims span {seconds(claims[-1] - claims[0]):.2f} s, handler starts {seconds(starts[-1] - starts[0]):.2f} s")
    flow.assert_no_claim_failed()


@pytest.mark.timeout(90)
def test_pause_under_load_stops_starts_within_1_s_and_resume_finishes_within_3_s(flow):
    # Enough work that, unpaused, the two workers would still be starting jobs 1 s after the pause.
    jobs, ms = 300, 50
    flow.start_workers()
    rl.enqueue_many(flow.engine, [rl.JobSpec(PAUSABLE, {"ms": ms}) for _ in range(jobs)])
    wait_until(lambda: len(flow.runs(PAUSABLE)) >= 20, timeout=30, what="20 jobs started")
    paused_at = rl.pause_queue(flow.engine, PAUSABLE_QUEUE).paused_at
    quiet_until = paused_at + timedelta(seconds=1.5)

    # Nothing can signal that no job starts: watch the queue past the bound, until its running jobs are done.
    def settled() -> bool:
        leased = scalar(flow.engine, "SELECT count(*) FROM job_queue WHERE queue = :q AND status = 'LEASED'",
                        q=PAUSABLE_QUEUE)
        return leased == 0 and flow.now() > quiet_until

    wait_until(settled, timeout=20, what="the paused queue's running jobs done")
    started = [run.started_at for run in flow.runs(PAUSABLE)]
    assert max(started) <= paused_at + timedelta(seconds=1)
    assert flow.succeeded(PAUSABLE) < jobs, "the queue drained before the pause: no load left to hold back"
    resumed_at = flow.now()
    rl.resume_queue(flow.engine, PAUSABLE_QUEUE)
    flow.wait_succeeded(PAUSABLE, jobs, timeout=30)
    last = scalar(flow.engine, "SELECT max(finished_at) FROM job_queue WHERE queue = :q", q=PAUSABLE_QUEUE)
    print(f"{len(started)} started before the pause took hold; the other {jobs - len(started)} done"
          f" {seconds(last - resumed_at):.2f} s after the resume")
    assert seconds(last - resumed_at) <= 3.0
    assert min(run.started_at for run in flow.runs(PAUSABLE) if run.started_at > quiet_until) > resumed_at
    flow.assert_no_claim_failed()


@pytest.mark.timeout(90)
def test_sigkilled_worker_holding_a_keys_job_frees_the_key_within_the_lease_bound_and_never_runs_it_twice_at_once(flow):
    settings = {"lease_ttl_seconds": 1.0, "heartbeat_interval_seconds": 0.25, "reaper_interval_seconds": 0.25,
                "poll_interval_ms": 100}
    flow.start_workers(**settings)
    held = rl.enqueue(flow.engine, HOLD, {"key": "k", "seq": 0, "ms": 40}, concurrency_key="k")
    for seq in range(1, 4):
        rl.enqueue(flow.engine, KEYED, {"key": "k", "seq": seq, "ms": 40}, concurrency_key="k")
    rl.enqueue_many(flow.engine, [rl.JobSpec(KEYED, {"key": "free", "seq": seq, "ms": 40}, concurrency_key="free")
                                  for seq in range(5)])
    first = wait_until(lambda: next(iter(flow.runs(HOLD)), None), timeout=30, what="the held job running")
    # Another key is not held up by the held one.
    wait_until(lambda: flow.succeeded(KEYED) == 5, timeout=30, what="the other key's jobs done")
    assert [run.concurrency_key for run in flow.runs(KEYED)] == ["free"] * 5
    holder = next(worker for worker in flow.workers if worker.process.pid == first.pid)
    holder.kill()
    killed_at = flow.now()

    flow.wait_succeeded(HOLD, 1, timeout=30)
    flow.wait_succeeded(KEYED, 8, timeout=30)
    hold_runs = flow.runs(HOLD)
    assert [run.attempt for run in hold_runs] == [1, 2]
    second = hold_runs[1]
    assert second.pid != first.pid
    # The killed attempt ended with its process; the next started after that, and within the bound.
    assert second.started_at > killed_at
    bound = settings["lease_ttl_seconds"] + settings["reaper_interval_seconds"] + settings["poll_interval_ms"] / 1000
    print(f"the held job ran again {seconds(second.started_at - killed_at):.2f} s after the kill (bound {bound:.2f} s)")
    assert seconds(second.started_at - killed_at) <= bound + RECOVERY_SLACK_SECONDS
    attempts = rows(flow.engine, "SELECT attempt, leased_at, finished_at FROM job_attempts WHERE job_id = :j"
                                 " ORDER BY attempt", j=held.id)
    assert attempts[0].finished_at is not None and attempts[0].finished_at <= attempts[1].leased_at
    # The key's next jobs waited for the held job's second run, then went one at a time in order.
    key_runs = [run for run in flow.runs(KEYED) if run.concurrency_key == "k"]
    assert [run.seq for run in key_runs] == [1, 2, 3]
    assert key_runs[0].started_at > second.finished_at
    for earlier, later in itertools.pairwise(key_runs):
        assert earlier.finished_at < later.started_at


@pytest.mark.timeout(90)
def test_an_open_transaction_that_enqueued_a_keyed_job_does_not_hold_up_the_outcome_of_its_keys_running_job(flow):
    flow.start_workers()
    running = rl.enqueue(flow.engine, KEYED, {"key": "k", "seq": 0, "ms": 200}, concurrency_key="k")
    wait_until(lambda: flow.runs(KEYED), timeout=30, what="the key's job running")
    with flow.engine.connect() as application:
        # An application's transaction that enqueued the key's next job and has not committed yet.
        rl.enqueue(application, KEYED, {"key": "k", "seq": 1, "ms": 0}, concurrency_key="k")
        wait_until(lambda: flow.runs(KEYED)[0].finished_at, timeout=30, what="the running job's handler done")
        try:
            wait_until(lambda: rl.get_job(flow.engine, running.id).status == rl.JobStatus.SUCCEEDED, timeout=3,
                       what="the running job's success written while the other transaction is open")
        finally:
            application.rollback()


@pytest.mark.timeout(120)
def test_key_and_global_limits_hold_behind_pgbouncer_in_transaction_pooling(flow, pgbouncer):  # noqa: F811 - the fixture
    flow.start_workers(url=pgbouncer.url(flow.url), pool_mode="transaction")
    rl.enqueue_many(flow.engine, [rl.JobSpec(CAPPED, {"ms": 80}) for _ in range(24)])
    enqueue_keyed(flow.engine, keys=8, per_key=6, ms=40)
    flow.wait_succeeded(KEYED, 48, timeout=60)
    flow.wait_succeeded(CAPPED, 24, timeout=60)
    assert_keys_serial_in_order(flow, keys=8, per_key=6)
    assert_global_limit_held_and_reached(flow, CAPPED, CAPPED_QUEUE)
    flow.assert_no_claim_failed()

