"""The demo behind ``runledger-sync demo`` and ``make demo``.

With no database URL it starts an embedded PostgreSQL of its own; with one it uses
that database. It migrates, enqueues a few hundred jobs of five types (quick ones,
slow ones that report progress, one that retries once, one that is dead-lettered
at once, one that times out until it is dead-lettered), runs a real supervisor
with a live progress line, and ends with a summary table and the commands that
inspect the dead letters.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any, Optional

import runledger_sync as rl
from runledger_sync.logging import ROOT_LOGGER_NAME

QUICK_JOBS = 240
SLOW_JOBS = 40
SETTLE_TIMEOUT_SECONDS = 90.0
#: How often the progress line is redrawn on a terminal, and printed anew elsewhere.
TERMINAL_REFRESH_SECONDS = 0.2
PLAIN_REFRESH_SECONDS = 1.0
PROGRESS_BAR_WIDTH = 30


def build_registry() -> rl.JobRegistry:
    """The demo's handlers: quick, slow with progress, flaky once, always broken, always too slow."""
    registry = rl.JobRegistry()

    @registry.job("demo.greet")
    def greet(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        return rl.JobCompletion.success().with_output({"greeting": f"hello, {payload['name']}"})

    @registry.job("demo.resize", timeout_seconds=30)
    def resize(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        steps = 4
        for step in range(1, steps + 1):
            if ctx.wait_cancelled(0.05):
                ctx.check_cancelled()
            ctx.report_progress(step, steps)
        return rl.JobCompletion.success().with_output({"width": payload["width"] // 2})

    @registry.job("demo.flaky", retry_delay_overrides={"demo.upstream_busy": 500})
    def flaky(ctx: rl.JobContext, payload: dict) -> None:
        if ctx.attempt == 1:
            raise rl.JobFailure.retryable("demo.upstream_busy", "upstream said 503; trying again soon")

    @registry.job("demo.broken", max_attempts=3)
    def broken(ctx: rl.JobContext, payload: dict) -> None:
        raise rl.JobFailure.terminal("demo.bad_input", "this input can never be processed")

    @registry.job("demo.stuck", max_attempts=2, timeout_seconds=1,
                  retry_delay_overrides={"job.timeout_exceeded": 200})
    def stuck(ctx: rl.JobContext, payload: dict) -> None:
        # Far longer than its timeout; it stops when the worker cancels it.
        ctx.wait_cancelled(30)
        ctx.check_cancelled()

    return registry


def enqueue_demo_jobs(engine: Any) -> list[rl.JobRecord]:
    specs = [rl.JobSpec("demo.greet", {"name": f"user-{n}"}) for n in range(QUICK_JOBS)]
    specs += [rl.JobSpec("demo.resize", {"width": 640 + 10 * n}) for n in range(SLOW_JOBS)]
    specs += [
        rl.JobSpec("demo.flaky", {"call": "upstream"}),
        rl.JobSpec("demo.broken", {"input": "???"}),
        rl.JobSpec("demo.stuck", {"wait": "forever"}),
    ]
    return rl.enqueue_many(engine, specs)


#: Where each job type is expected to end, and after how many attempts.
EXPECTED = {
    "demo.greet": (rl.JobStatus.SUCCEEDED, 1),
    "demo.resize": (rl.JobStatus.SUCCEEDED, 1),
    "demo.flaky": (rl.JobStatus.SUCCEEDED, 2),
    "demo.broken": (rl.JobStatus.DEAD_LETTERED, 1),
    "demo.stuck": (rl.JobStatus.DEAD_LETTERED, 2),
}


@dataclass(frozen=True)
class Tally:
    """Where the demo's jobs are now."""

    total: int
    done: int
    dead: int
    retrying: int

    @property
    def settled(self) -> bool:
        return self.done + self.dead == self.total

    def line(self) -> str:
        settled = self.done + self.dead
        filled = PROGRESS_BAR_WIDTH * settled // max(1, self.total)
        bar = "#" * filled + "." * (PROGRESS_BAR_WIDTH - filled)
        return f"[{bar}] {settled}/{self.total}  done {self.done}  retrying {self.retrying}  dead {self.dead}"


def tally(engine: Any, total: int) -> Tally:
    by_status = rl.queue_stats(engine).by_status
    # A retry waits as a PENDING job that has already spent an attempt.
    waiting = rl.list_jobs(engine, status=rl.JobStatus.PENDING, limit=max(1, total))
    return Tally(
        total=total,
        done=by_status.get(rl.JobStatus.SUCCEEDED.value, 0),
        dead=by_status.get(rl.JobStatus.DEAD_LETTERED.value, 0),
        retrying=sum(1 for job in waiting if job.attempt >= 1),
    )


def run_demo(database_url: Optional[str] = None, *, out: IO[str] = sys.stdout) -> int:
    """Run the demo end to end and return a process exit status (0 when every job settled as expected).

    Its server's data and its worker log live in a directory of its own (``tempfile.mkdtemp``),
    removed at the end; the log is kept, and its path printed, when a job did not end as expected.
    """
    work_dir = tempfile.mkdtemp(prefix="runledger-demo-")
    log_path = os.path.join(work_dir, "worker.log")
    status = 1
    server = None
    try:
        if database_url is None:
            data_dir = os.path.join(work_dir, "pgdata")
            out.write(f"starting embedded PostgreSQL in {data_dir} ...\n")
            server = rl.EmbeddedPostgres(data_dir, delete_on_stop=True).start()
            database_url = server.create_database("runledger_demo")
        with open(log_path, "w", encoding="utf-8") as log_file:
            handler = rl.configure_logging("INFO", stream=log_file)
            out.write(f"worker logs (JSON lines) go to {log_path}\n")
            try:
                status = _run(database_url, out, embedded=server is not None)
            finally:
                # The file closes here; a handler left on it would fail every later record.
                logging.getLogger(ROOT_LOGGER_NAME).removeHandler(handler)
        return status
    finally:
        if server is not None:
            server.stop()
        if status == 0:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            out.write(f"the worker log is kept in {log_path}\n")


def _run(database_url: str, out: IO[str], *, embedded: bool) -> int:
    engine = rl.create_engine(database_url)
    try:
        rl.migrate(engine)
        out.write(f"schema at revision {rl.current_revision(engine)}\n")
        registry = build_registry()
        registry.sync_definitions(engine)
        jobs = enqueue_demo_jobs(engine)
        types = Counter(job.job_type for job in jobs)
        out.write(f"enqueued {len(jobs)} jobs: " + ", ".join(f"{n} {t}" for t, n in types.items()) + "\n")
        config = rl.JobsConfig(poll_interval_ms=50, max_global_concurrency=8, lease_ttl_seconds=10,
                               reaper_interval_seconds=1, timeout_grace_seconds=1)
        started = time.monotonic()
        with rl.Supervisor(engine, registry, config):
            last = _watch_progress(engine, len(jobs), started + SETTLE_TIMEOUT_SECONDS, out)
        elapsed = time.monotonic() - started
        if not last.settled:
            out.write(f"\nnot every job settled within {SETTLE_TIMEOUT_SECONDS:.0f} s\n")
        return _report(engine, jobs, elapsed, out, database_url=database_url, embedded=embedded)
    finally:
        engine.dispose()


def _watch_progress(engine: Any, total: int, deadline: float, out: IO[str]) -> Tally:
    """Print the progress line until every job settled or the deadline passed; return the last tally."""
    terminal = out.isatty()
    refresh = TERMINAL_REFRESH_SECONDS if terminal else PLAIN_REFRESH_SECONDS
    while True:
        current = tally(engine, total)
        # On a terminal the line is redrawn in place; in a log every tally is a line of its own.
        out.write(("\r" + current.line()) if terminal else current.line() + "\n")
        out.flush()
        if current.settled or time.monotonic() >= deadline:
            if terminal:
                out.write("\n")
            return current
        time.sleep(refresh)


def _report(engine: Any, jobs: list[rl.JobRecord], elapsed: float, out: IO[str], *,
            database_url: str, embedded: bool) -> int:
    out.write(f"\nfinished in {elapsed:.1f} s\n\n")
    rows: dict[tuple[str, str, int], int] = Counter()
    errors: dict[str, str] = {}
    unexpected = 0
    for job in jobs:
        current = rl.get_job(engine, job.id)
        if current is None:  # deleted by someone else meanwhile: not the outcome the demo expects
            unexpected += 1
            continue
        rows[(current.job_type, current.status.value, current.attempt)] += 1
        if current.last_error_code:
            errors[current.job_type] = current.last_error_code
        if (current.status, current.attempt) != EXPECTED[current.job_type]:
            unexpected += 1
    out.write(f"{'job type':<12} {'status':<14} {'attempts':>8} {'jobs':>5}  last error\n")
    out.write("-" * 66 + "\n")
    for (job_type, status, attempt), count in sorted(rows.items()):
        out.write(f"{job_type:<12} {status:<14} {attempt:>8} {count:>5}  {errors.get(job_type, '')}\n")
    dead = rl.list_dead_letters(engine)
    out.write(f"\n{len(dead)} dead letters:\n")
    for letter in dead:
        out.write(f"  {letter.job_type} {letter.job_id} {letter.error_code}: {letter.error_message}\n")
    shown_url = rl.mask_url(database_url)
    out.write("\ninspect them with:\n")
    out.write(f"  runledger-sync --database-url '{shown_url}' dead-letters list\n")
    if dead:
        out.write(f"  runledger-sync --database-url '{shown_url}' jobs show {dead[0].job_id}\n")
    out.write(f"  runledger-sync --database-url '{shown_url}' dead-letters replay --type demo.broken --dry-run\n")
    if embedded:
        out.write("(the embedded server stops now; run `runledger-sync demo --database-url URL` against a\n"
                  " database of your own to keep the jobs and try those commands)\n")
    out.write("\ndemo finished as expected\n" if unexpected == 0 else f"\n{unexpected} jobs did NOT end as expected\n")
    return 0 if unexpected == 0 else 1
