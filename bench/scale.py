"""Print throughput with 1, 2, 4 and 8 worker processes, and the claim statement's time at 10,000 vs 1,000,000 pending jobs.

Usage: python bench/scale.py [--jobs 10000] [--workers 1,2,4,8] [--concurrency 8]
                             [--pending 10000,1000000] [--claims 200] [--only throughput|claims]
                             [--database-url URL]
Throughput: K worker processes (bench/peers/run_runledger.py, the same runner as
compare.py) are started on an empty queue and waited for until each listens for new
jobs; N no-op jobs are then enqueued in one transaction, so all become claimable, and
every worker is woken, at its commit. The drain is timed by the job rows themselves,
from the first claim (min started_at) to the last success (max finished_at), and the
figure is refused (exit status 1, nothing printed) if the jobs did not each succeed
once or the span is shorter than a stretch the script saw the drain running.
Worker and PostgreSQL CPU are read from /proc over the drain.
Claim time: the real
store.driver.claim_jobs, a batch of --claim-limit, each in a transaction rolled
back so every call sees the same queue; the rows are inserted with one
INSERT ... SELECT generate_series into the library's own job_queue table.
The worker's own claim (claim_prestart_jobs_for_types on a held connection: a
prepared statement planned once, at the first size, and kept as the queue grows)
is timed too, after the rolled-back ones; its claims commit, so each size's queue
loses --claims x --claim-limit pending jobs while it is timed.
Target: the claim at the largest size within 2x of the smallest.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import _common as bench
import compare
import psycopg2
from sqlalchemy import Integer, bindparam, func, literal, select

import runledger_sync as rl
from runledger_sync.db.schema import job_queue
from runledger_sync.store.driver import HeldConnection, claim_jobs, claim_prestart_jobs_for_types


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated worker process counts")
    parser.add_argument("--concurrency", type=int, default=8, help="per worker process")
    parser.add_argument("--pending", default="10000,1000000", help="comma-separated queue sizes for the claim timing")
    parser.add_argument("--claims", type=int, default=200, help="timed claims per size")
    parser.add_argument("--claim-limit", type=int, default=rl.JobsConfig().claim_batch_size)
    parser.add_argument("--only", choices=("throughput", "claims"), help="run one of the two parts")
    bench.add_database_option(parser)
    args = parser.parse_args()
    args.workers = [int(k) for k in args.workers.split(",")]
    args.pending = sorted(int(k) for k in args.pending.split(","))
    return args


# -- throughput by worker count --------------------------------------------------------

#: Between looks at the drain's progress; each look is three index probes, cheap next to the drain.
WATCH_SECONDS = 0.010
#: The ``application_name`` a worker's listener session carries, so it can be found in pg_stat_activity.
LISTENER_APPLICATION_NAME = "runledger-listener"
JOB_LISTEN = "LISTEN runledger_jobs"

# statement_timestamp() is taken before the statement's snapshot and clock_timestamp()
# after it, so each bounds the snapshot from its side, on the clock the job rows use.
_LOOK = """
SELECT statement_timestamp(), clock_timestamp(),
       EXISTS (SELECT 1 FROM job_queue WHERE status = ANY(%(claimed)s)),
       EXISTS (SELECT 1 FROM job_queue WHERE status = 'PENDING'),
       EXISTS (SELECT 1 FROM job_queue WHERE status = ANY(%(unfinished)s))
"""
_CLAIMED = [rl.JobStatus.LEASED.value, rl.JobStatus.SUCCEEDED.value]
_UNFINISHED = [rl.JobStatus.PENDING.value, rl.JobStatus.LEASED.value]

# The drain as the job rows record it: each job's started_at is set by its first
# claim and its finished_at by its success write, both the server's now().
_RECORD = """
SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'),
       extract(epoch FROM max(finished_at) - min(started_at)),
       (SELECT count(*) FROM job_attempts),
       (SELECT count(*) FROM job_attempts WHERE finished_at IS NOT NULL)
FROM job_queue
"""


class ImpossibleFigure(RuntimeError):
    """A drain's figures contradict the database's record or what the script saw; nothing is printed."""


@dataclass
class Drain:
    jobs: int
    seconds: float  # first claim to last finish, from the job rows
    watched: float  # a stretch the script saw the drain run, which the drain must outlast
    worker_ms: float
    postgres_ms: Optional[float]

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


def wait_for_listeners(cursor, workers: int, processes: Sequence, deadline: float) -> None:
    """Wait until every worker process listens for new jobs, so a commit wakes them all at once."""
    while True:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = %s AND query = %s", (LISTENER_APPLICATION_NAME, JOB_LISTEN))
        if cursor.fetchone()[0] >= workers:
            return
        _check_alive(processes)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} worker processes were not all listening within 120 s")
        time.sleep(WATCH_SECONDS)


def watch_drain(cursor, processes: Sequence, deadline: float) -> float:
    """Look until no job is pending or leased; return a stretch the drain is known to have lasted.

    The first look that sees a claimed job ends after its snapshot, which is after that
    claim's commit and so after the first job's started_at. The last look that sees a
    pending job begins before its snapshot, so that job's claim commits later and its
    finished_at comes later still. The drain therefore lasts longer than the time
    between the two, whoever's clock or column is wrong.
    """
    first_claim_seen = last_pending_seen = None
    while True:
        cursor.execute(_LOOK, {"claimed": _CLAIMED, "unfinished": _UNFINISHED})
        began, ended, claimed, pending, unfinished = cursor.fetchone()
        if claimed and first_claim_seen is None:
            first_claim_seen = ended
        if pending:
            last_pending_seen = began
        if not unfinished:
            break
        _check_alive(processes)
        if time.monotonic() > deadline:
            raise RuntimeError("the drain did not finish within 30 min")
        time.sleep(WATCH_SECONDS)
    if first_claim_seen is None or last_pending_seen is None:
        return 0.0
    return max(0.0, (last_pending_seen - first_claim_seen).total_seconds())


def _check_alive(processes: Sequence) -> None:
    exited = [p.returncode for p in processes if p.poll() is not None]
    if exited:
        raise RuntimeError(f"a worker process exited early with status {exited[0]}")


def check_possible(drain: Drain, succeeded: int, attempts: int, finished_attempts: int, workers: int) -> None:
    """Refuse a figure the run cannot have produced.

    A rate is the jobs over a span, so it is only as true as both. Every job must have
    succeeded on exactly one attempt, or the count is not what was drained. And the
    span must outlast the stretch the script itself saw the drain running (see
    watch_drain): that stretch is measured from outside the workers and the job
    rows, from snapshots alone, so a span shorter than it (a clock started after
    the first jobs ran, a column that is not the claim or the finish) is impossible,
    not merely noisy, however fast the machine.

    Raises:
        ImpossibleFigure: with what was expected and what was found.
    """
    if not succeeded == attempts == finished_attempts == drain.jobs:
        raise ImpossibleFigure(
            f"{workers} process(es): expected {drain.jobs:,} jobs SUCCEEDED with one finished attempt each, found "
            f"{succeeded:,} SUCCEEDED and {finished_attempts:,} finished of {attempts:,} attempts")
    if not drain.seconds > drain.watched:
        raise ImpossibleFigure(
            f"{workers} process(es): the jobs record a drain of {drain.seconds:.3f} s ({drain.rate:,.0f} jobs/s), "
            f"but the script saw it running for {drain.watched:.3f} s; a drain cannot be shorter than that")


def drain_with(srv: bench.Server, workers: int, args: argparse.Namespace) -> Drain:
    """Drain ``args.jobs`` no-op jobs with ``workers`` processes, all listening before the jobs commit."""
    system = compare.SYSTEMS[compare.OURS]
    runner = compare.Runner(system, Path(sys.executable))
    with compare.phase_database(srv, runner, f"scale{workers}") as url:
        engine = rl.create_engine(url)
        watcher = psycopg2.connect(url)
        watcher.autocommit = True
        postgres = bench.PostgresCpu(url)
        postgres.exclude_backend(watcher.get_backend_pid())
        try:
            with contextlib.ExitStack() as stack, watcher.cursor() as cursor:
                processes = [stack.enter_context(runner.worker(url, args.concurrency)) for _ in range(workers)]
                wait_for_listeners(cursor, workers, processes, time.monotonic() + 120)
                window = bench.CpuWindow(lambda: sum(bench.tree_cpu_seconds(p.pid) for p in processes), postgres)
                # One transaction: every job becomes claimable, and every worker is woken, at its commit.
                with engine.begin() as conn:
                    rl.enqueue_many(conn, (rl.JobSpec(bench.NOOP_TYPE, {"n": n}) for n in range(args.jobs)))
                    window.start()
                watched = watch_drain(cursor, processes, time.monotonic() + 1_800)
                window.stop()
                cursor.execute(_RECORD)
                succeeded, seconds, attempts, finished_attempts = cursor.fetchone()
        finally:
            watcher.close()
            engine.dispose()
    worker_ms, postgres_ms = window.per_job_ms(args.jobs)
    drain = Drain(args.jobs, float(seconds or 0.0), watched, worker_ms, postgres_ms)
    check_possible(drain, succeeded, attempts, finished_attempts, workers)
    return drain


def report_throughput(srv: bench.Server, args: argparse.Namespace) -> None:
    rows, base = [], None
    for workers in args.workers:
        print(f"draining {args.jobs:,} jobs with {workers} worker process(es)", flush=True)
        drain = drain_with(srv, workers, args)
        base = base or drain.rate
        rows.append([str(workers), bench.fmt(drain.rate), f"{drain.rate / base:.2f}x", f"{drain.seconds:.3f}",
                     f"{drain.watched:.3f}", f"{drain.worker_ms:.3f}", bench.fmt(drain.postgres_ms, 3)])
    print(f"\njobs={args.jobs} concurrency per process={args.concurrency}; "
          "drain: first claim to last finish from the job rows; seen: a stretch the script saw it run")
    bench.print_table(["processes", "processed/s", f"vs {args.workers[0]}", "drain s", "seen s", "worker CPU ms/job",
                       "PG CPU ms/job"], rows)


# -- claim time by queue size -----------------------------------------------------------


def _bulk_insert_statement():
    series = func.generate_series(1, bindparam("count", type_=Integer)).table_valued("value").render_derived()
    # Stagger the timestamps as a stream of enqueues would, so the claim order is not all ties.
    stamp = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, (bindparam("count", type_=Integer) - series.c.value) / 1000.0)
    rows = select(
        func.gen_random_uuid(), literal(bench.NOOP_TYPE), func.jsonb_build_object("n", series.c.value), literal(1), stamp, stamp
    ).select_from(series)
    return job_queue.insert().from_select(["id", "job_type", "payload", "max_attempts", "created_at", "next_run_at"], rows)


def grow_queue(engine, count: int) -> float:
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(_bulk_insert_statement(), {"count": count})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE job_queue")
    return time.perf_counter() - started


def time_claims(engine, args: argparse.Namespace) -> list[float]:
    timings = []
    with engine.connect() as conn:
        for _ in range(args.claims):
            transaction = conn.begin()
            started = time.perf_counter()
            claimed = claim_jobs(conn, worker_id="bench-scale", lease_ttl_seconds=60, limit=args.claim_limit)
            timings.append((time.perf_counter() - started) * 1000)
            transaction.rollback()
            _check_full(claimed, args)
    return timings


def time_worker_claims(held: HeldConnection, args: argparse.Namespace) -> list[float]:
    timings = []
    for _ in range(args.claims):
        started = time.perf_counter()
        claimed = claim_prestart_jobs_for_types(held, worker_id="bench-scale", lease_ttl_seconds=60,
                                                limit=args.claim_limit, job_types=[bench.NOOP_TYPE])
        timings.append((time.perf_counter() - started) * 1000)
        _check_full(claimed, args)
    return timings


def _check_full(claimed: list, args: argparse.Namespace) -> None:
    if len(claimed) != args.claim_limit:
        raise RuntimeError(f"claimed {len(claimed)} of {args.claim_limit}: the queue ran short of pending jobs")


def report_claims(srv: bench.Server, args: argparse.Namespace) -> None:
    rows, medians, worker_medians = [], [], []
    with bench.fresh_database(srv, "bench_scale_claim") as url:
        engine = bench.migrated_engine(url)
        held = HeldConnection(engine)
        try:
            bench.noop_registry().sync_definitions(engine)
            size = 0
            for pending in args.pending:
                print(f"growing the queue to {pending:,} pending jobs", flush=True)
                insert_seconds = grow_queue(engine, pending - size)
                size = pending
                timings = time_claims(engine, args)
                worker_timings = time_worker_claims(held, args)
                medians.append(bench.percentile(timings, 0.50))
                worker_medians.append(bench.percentile(worker_timings, 0.50))
                rows.append([f"{pending:,}", f"{medians[-1]:.2f}", f"{bench.percentile(timings, 0.95):.2f}",
                             f"{worker_medians[-1]:.2f}", f"{bench.percentile(worker_timings, 0.95):.2f}",
                             f"{insert_seconds:.1f}"])
        finally:
            held.close()
            engine.dispose()
    print(f"\nclaim_jobs(limit={args.claim_limit}) rolled back, and the worker's prepared claim, {args.claims} calls each per size")
    bench.print_table(["pending jobs", "claim p50 ms", "claim p95 ms", "worker claim p50 ms", "worker claim p95 ms",
                       "insert+analyze s"], rows)
    for label, values in (("claim", medians), ("worker claim", worker_medians)):
        print(f"{label} p50 at {args.pending[-1]:,} / at {args.pending[0]:,}: {values[-1] / values[0]:.2f}x (target <= 2x)")


def main() -> int:
    args = parse_args()
    with bench.server(args.database_url) as srv:
        try:
            if args.only != "claims":
                report_throughput(srv, args)
        except ImpossibleFigure as error:
            print(f"scale.py: refusing an impossible figure: {error}", file=sys.stderr)
            return 1
        if args.only != "throughput":
            report_claims(srv, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
