"""Print whether a worker started on a new database keeps its pace as its tables grow.

Usage: python bench/growth.py [--jobs 20000] [--database-url URL]
       python bench/growth.py --finished 1000000   # the same over a table that already holds a million finished jobs

A new database's tables are analyzed while still empty (autovacuum does so soon
after they are created), and a worker plans its prepared statements once per
connection on whatever statistics there are then. This script makes such a
database, migrates it, runs ANALYZE on the empty tables, enqueues --jobs no-op
jobs and starts a Supervisor at JobsConfig defaults, as a user would, until
every job is durably SUCCEEDED. It prints the rate of the first and the last
quarter of the jobs, the whole batch's rate, and the index tuples read per job on
job_attempts and job_queue (pg_stat_user_indexes before and after, enqueue
included; each index that reads a tuple or more per job is named). Then, on the same worker (same connections, same plans) and without
another ANALYZE, a second batch of --jobs jobs enters in one transaction over the
first batch's finished ones: its rate, and its ratio to the first batch's.

With --finished N, job_queue and job_attempts are first filled with N finished
jobs and their attempts by INSERT ... SELECT, and ANALYZE runs on those instead.

Autovacuum stays on, as on a user's server: it may analyze the tables during a
run (the last such vacuum and analyze of each table are printed), but the
worker's connections keep the plans they made first. Jobs count as
done when the worker's success group write reports them (a WorkerObserver), so
counting them asks the database nothing that would show in the index figures.
The targets are printed as pass/fail lines; the exit status is 0 whatever they say.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator, Optional, Sequence

import _common as bench
from sqlalchemy import text
from sqlalchemy.engine import Engine

import runledger_sync as rl

#: The tables whose index reads per job are reported (and held to INDEX_READS_TARGET).
TABLES = ("job_attempts", "job_queue")
QUARTERS = 4
#: Targets: the last quarter's rate against the first's, the second batch's against the first's,
#: and index tuples read per job on each of TABLES.
PACE_TARGET = 0.8
INDEX_READS_TARGET = 40.0
#: How long a batch may take before the run gives up on it.
BATCH_TIMEOUT_SECONDS = 900.0
#: A backend that published its statistics less than a second before going idle
#: publishes the rest only 10 s later (PostgreSQL 15's PGSTAT_IDLE_INTERVAL): index
#: reads that hold still for longer than that are taken as complete.
STATS_QUIET_SECONDS = 11.0
STATS_SETTLE_LIMIT_SECONDS = 60.0
STATS_POLL_SECONDS = 1.0
#: How often a running batch looks for the oldest open transaction on the server.
HORIZON_POLL_SECONDS = 0.5

FILL_FINISHED_SQL = (
    "INSERT INTO job_queue (id, job_type, status, stage, max_attempts, attempt, queue, started_at, finished_at) "
    "SELECT gen_random_uuid(), :job_type, 'SUCCEEDED', 'completed', 3, 1, 'default', now(), now() "
    "FROM generate_series(1, :count)"
)
FILL_ATTEMPTS_SQL = (
    "INSERT INTO job_attempts (id, job_id, run_number, attempt, worker_id, finished_at) "
    "SELECT gen_random_uuid(), id, 1, 1, 'bench-growth-fill', now() FROM job_queue WHERE status = 'SUCCEEDED'"
)
AUTOVACUUM_SQL = (
    "SELECT relname, 'vacuum', extract(epoch FROM last_autovacuum - :since) FROM pg_stat_user_tables "
    "WHERE schemaname = current_schema() AND relname = ANY(:tables) AND last_autovacuum > :since "
    "UNION ALL SELECT relname, 'analyze', extract(epoch FROM last_autoanalyze - :since) FROM pg_stat_user_tables "
    "WHERE schemaname = current_schema() AND relname = ANY(:tables) AND last_autoanalyze > :since ORDER BY 3"
)
#: Transactions begun since the oldest one still open (or still seen by a snapshot) anywhere on the
#: server, this reading's own aside (the worker's count: they are young). While an old one is open,
#: no backend can tell that a claimed job's old row is dead.
OLDEST_TRANSACTION_SQL = (
    "SELECT coalesce(max(greatest(age(backend_xid), age(backend_xmin))), 0) FROM pg_stat_activity "
    "WHERE pid <> pg_backend_pid()"
)
INDEX_READS_SQL = (
    "SELECT relname, indexrelname, idx_tup_read FROM pg_stat_user_indexes "
    "WHERE schemaname = current_schema() AND relname = ANY(:tables)"
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in each of the two batches (default 20000)")
    parser.add_argument("--finished", type=int, default=0,
                        help="fill the tables with this many finished jobs before ANALYZE (default: none, empty tables)")
    bench.add_database_option(parser)
    args = parser.parse_args()
    if args.jobs < QUARTERS:
        parser.error(f"--jobs must be at least {QUARTERS}")
    if args.finished < 0:
        parser.error("--finished must be 0 or more")
    return args


@dataclass
class Batch:
    """One batch's quarter marks, in perf_counter seconds, from the moment its jobs could first run."""

    total: int
    started: float
    marks: list[float] = field(default_factory=list)
    done: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    #: The largest OLDEST_TRANSACTION_SQL reading while the batch ran.
    oldest_transaction: int = 0

    def quarter_ends(self) -> list[int]:
        return [self.total * quarter // QUARTERS for quarter in range(1, QUARTERS + 1)]

    def quarter_rates(self) -> list[float]:
        ends, starts = self.quarter_ends(), [0, *self.quarter_ends()[:-1]]
        times = [self.started, *self.marks]
        return [(end - start) / (times[i + 1] - times[i]) for i, (start, end) in enumerate(zip(starts, ends, strict=True))]

    def rate(self) -> float:
        return self.total / (self.marks[-1] - self.started)


class DurableSuccesses:
    """A WorkerObserver that counts jobs whose SUCCEEDED rows are committed, and marks each quarter of a batch.

    Only the success group write matters here; the protocol's other points are
    told to it too, and ignored.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch: Optional[Batch] = None

    def follow(self, batch: Batch) -> None:
        """Count towards ``batch`` from now on (the previous one is done: nothing else is running)."""
        with self._lock:
            self._batch = batch

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        if writer != "success":
            return
        now = time.perf_counter()
        with self._lock:
            batch = self._batch
            if batch is None:
                return
            batch.done += size
            ends = batch.quarter_ends()
            while len(batch.marks) < QUARTERS and batch.done >= ends[len(batch.marks)]:
                batch.marks.append(now)
            if batch.done >= batch.total:
                batch.finished.set()

    def claimed(self, jobs: Sequence[object]) -> None:
        pass

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Optional[float]) -> None:
        pass

    def heartbeat_failed(self, job_type: str) -> None:
        pass


def index_reads(engine: Engine) -> dict[tuple[str, str], int]:
    """Index tuples read so far through each index of TABLES, by (table, index), as the statistics hold them now."""
    with engine.connect() as connection:
        rows = connection.execute(text(INDEX_READS_SQL), {"tables": list(TABLES)}).all()
    return {(table, index): int(reads) for table, index, reads in rows}


def database_now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.execute(text("SELECT clock_timestamp()")).scalar_one()


def autovacuum_since(engine: Engine, since: datetime) -> str:
    """Autovacuum's last vacuum and analyze of TABLES after ``since``, in seconds from it (each table's last only)."""
    with engine.connect() as connection:
        rows = connection.execute(text(AUTOVACUUM_SQL), {"since": since, "tables": list(TABLES)}).all()
    return ", ".join(f"{action} of {table} at +{float(seconds):.1f} s" for table, action, seconds in rows) or "none"


def settled_index_reads(engine: Engine) -> dict[tuple[str, str], int]:
    """Index reads once every backend has published what it read: the figures held still for STATS_QUIET_SECONDS.

    An idle worker's claims find nothing and normally read nothing, so only late
    publications move the figures. When they keep moving (an idle claim reading
    entries of finished jobs it cannot yet tell are dead), the reading after
    STATS_SETTLE_LIMIT_SECONDS is taken, and said so.
    """
    started = last_change = time.monotonic()
    reads = index_reads(engine)
    while time.monotonic() - last_change < STATS_QUIET_SECONDS:
        if time.monotonic() - started > STATS_SETTLE_LIMIT_SECONDS:
            print(f"note: index reads still moving after {STATS_SETTLE_LIMIT_SECONDS:.0f} s of an idle worker; "
                  "the figures include its idle claims")
            return reads
        time.sleep(STATS_POLL_SECONDS)
        current = index_reads(engine)
        if current != reads:
            reads, last_change = current, time.monotonic()
    return reads


def oldest_transaction(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(OLDEST_TRANSACTION_SQL)).scalar_one())


def run_sql(engine: Engine, statement: str, **parameters: object) -> None:
    """Run one statement outside a transaction block (ANALYZE, big fills), committed when it returns."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text(statement), parameters)


def noop_specs(count: int, first: int) -> Iterator[rl.JobSpec]:
    return (rl.JobSpec(bench.NOOP_TYPE, {"n": n}) for n in range(first, first + count))


def fill_finished(engine: Engine, count: int) -> float:
    """``count`` finished no-op jobs, each with its attempt; return the seconds it took."""
    started = time.perf_counter()
    run_sql(engine, FILL_FINISHED_SQL, job_type=bench.NOOP_TYPE, count=count)
    run_sql(engine, FILL_ATTEMPTS_SQL)
    return time.perf_counter() - started


def wait(engine: Engine, batch: Batch, supervisor: rl.Supervisor, name: str) -> None:
    """Wait for ``batch`` to be done, noting the oldest open transaction on the server meanwhile."""
    deadline = time.monotonic() + BATCH_TIMEOUT_SECONDS
    while True:
        batch.oldest_transaction = max(batch.oldest_transaction, oldest_transaction(engine))
        if batch.finished.wait(HORIZON_POLL_SECONDS):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: only {batch.done:,} of {batch.total:,} jobs done in {BATCH_TIMEOUT_SECONDS:.0f} s"
                             f" (worker: {supervisor.failure or 'still running'})")


@dataclass
class IndexReads:
    """Index tuples read per job between two readings, by (table, index)."""

    by_index: dict[tuple[str, str], float]

    @classmethod
    def between(cls, before: dict[tuple[str, str], int], after: dict[tuple[str, str], int], jobs: int) -> "IndexReads":
        return cls({key: (reads - before.get(key, 0)) / jobs for key, reads in after.items()})

    def of_table(self, table: str) -> float:
        return sum(reads for (owner, _), reads in self.by_index.items() if owner == table)

    def described(self) -> str:
        """Each table's figure, then its indexes that read at least a tuple per job."""
        parts = []
        for table in TABLES:
            indexes = sorted(((reads, index) for (owner, index), reads in self.by_index.items()
                              if owner == table and reads >= 1), reverse=True)
            detail = ", ".join(f"{index} {reads:.1f}" for reads, index in indexes)
            parts.append(f"{table} {self.of_table(table):.1f}" + (f" ({detail})" if detail else ""))
        return "; ".join(parts)


def verdict(passed: bool, what: str) -> str:
    return f"  {'pass' if passed else 'FAIL'}  {what}"


def report_batch(name: str, batch: Batch, reads: IndexReads) -> None:
    rates = batch.quarter_rates()
    print(f"{name}: {batch.total:,} jobs in {batch.marks[-1] - batch.started:.2f} s, {batch.rate():,.0f} jobs/s; "
          f"quarters {' / '.join(f'{rate:,.0f}' for rate in rates)} jobs/s, last/first {rates[-1] / rates[0]:.2f}x")
    print(f"{' ' * len(name)}  index tuples read per job: {reads.described()}")
    print(f"{' ' * len(name)}  oldest open transaction on the server meanwhile: {batch.oldest_transaction:,} "
          "transactions old")


def measure(engine: Engine, args: argparse.Namespace) -> None:
    registry = bench.noop_registry()
    registry.sync_definitions(engine)
    if args.finished:
        seconds = fill_finished(engine, args.finished)
        print(f"filled {args.finished:,} finished jobs with their attempts in {seconds:.1f} s")
    run_sql(engine, "ANALYZE")
    observer = DurableSuccesses()
    config = rl.JobsConfig()
    print(f"jobs={args.jobs} finished before={args.finished} JobsConfig defaults "
          f"(concurrency {config.max_global_concurrency}, claim batch {config.claim_batch_size}); "
          f"statistics taken on {'the filled' if args.finished else 'the empty'} tables, autovacuum on")

    before_first = settled_index_reads(engine)
    rl.enqueue_many_ids(engine, noop_specs(args.jobs, 0))
    run_started = database_now(engine)
    supervisor = rl.Supervisor(engine, registry, config, observer=observer)
    first = Batch(args.jobs, time.perf_counter())
    observer.follow(first)
    supervisor.start()
    try:
        wait(engine, first, supervisor, "first batch")
        after_first = settled_index_reads(engine)

        # One transaction: every job of the batch becomes claimable at its commit, as the first batch's were at start.
        with engine.begin() as connection:
            rl.enqueue_many_ids(connection, noop_specs(args.jobs, args.jobs))
            second = Batch(args.jobs, time.perf_counter())
            observer.follow(second)
        wait(engine, second, supervisor, "second batch")
        after_second = settled_index_reads(engine)
    finally:
        supervisor.stop(timeout=60)
    second_started = second.started - first.started

    first_reads = IndexReads.between(before_first, after_first, args.jobs)
    second_reads = IndexReads.between(after_first, after_second, args.jobs)
    report_batch("first batch", first, first_reads)
    report_batch("second batch", second, second_reads)
    rates = first.quarter_rates()
    pace, again = rates[-1] / rates[0], second.rate() / first.rate()
    print(f"second batch over {args.jobs + args.finished:,} finished jobs: {again:.2f}x the first batch's rate")
    print(f"autovacuum since the first batch started (the second started at +{second_started:.1f} s): "
          f"{autovacuum_since(engine, run_started)}")
    print("targets:")
    print(verdict(pace >= PACE_TARGET, f"last quarter >= {PACE_TARGET}x the first: {pace:.2f}x"))
    for name, reads in (("first batch", first_reads), ("second batch", second_reads)):
        for table in TABLES:
            per_job = reads.of_table(table)
            print(verdict(per_job <= INDEX_READS_TARGET,
                          f"{name}: <= {INDEX_READS_TARGET:.0f} index tuples read per job on {table}: {per_job:.1f}"))
    print(verdict(again >= PACE_TARGET, f"second batch >= {PACE_TARGET}x the first batch's rate: {again:.2f}x"))


def main() -> int:
    args = parse_args()
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, f"rl_bench_growth_{os.getpid()}") as url:
        engine = rl.create_engine(url)
        try:
            rl.migrate(engine)
            measure(engine, args)
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
