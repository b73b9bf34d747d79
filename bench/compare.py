"""Run the same workloads on runledger-sync and its peers, on one PostgreSQL server in one run, and print a table.

Usage: python bench/compare.py [--jobs 10000] [--runs 1] [--systems runledger-sync,pgqueuer,procrastinate]
                               [--database-url URL]
The peers are installed from PyPI into bench/.peers-venv on first use (gitignored).

Every system is driven the same way, through a runner under bench/peers/ that uses
its library's public API, in a process of its own, each phase in a fresh database:
  processed   N pre-inserted no-op jobs drained by one worker process, each system with its
              own default settings (--concurrency default) or all capped at N jobs in flight;
              timed from outside, by polling the system's own job table, from the first
              job seen started to the last seen finished
  bulk        inserting those N jobs in batches (--bulk-batch)
  single      --single-jobs jobs inserted one call at a time from one thread
  latency     an idle worker (LISTEN/NOTIFY as each system does by default), jobs
              inserted one at a time 20 ms apart by another process: commit to handler start
  CPU/job     worker process tree and PostgreSQL server (from /proc) over the drain
              window, leaving out the backend of the polling observer
`pgbench -N` on the same server gives a yardstick for what the box can commit.
"""

# ruff: noqa: S603  (every command is one of our interpreters and runners, argument lists, no shell)
from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Iterator, Optional, Sequence

import _common as bench
import psycopg2

BENCH_DIR = Path(__file__).resolve().parent
RUNNERS_DIR = BENCH_DIR / "peers"
PEERS_VENV = BENCH_DIR / ".peers-venv"
OURS = "runledger-sync"
POLL_SECONDS = 0.005
STOP_TIMEOUT_SECONDS = 30
LATENCY_SETTLE_SECONDS = 1.0  # after "ready": listener connected, first empty poll done


@dataclass(frozen=True)
class System:
    """One queue: its runner, what to pip-install, and how to count its started/finished jobs."""

    name: str
    runner: str
    packages: tuple[str, ...]
    module: str
    # Returns (started, finished) for a database holding %(total)s jobs of this workload.
    progress_sql: str


SYSTEMS = {
    system.name: system
    for system in (
        System(
            OURS, "run_runledger.py", (), "runledger_sync",
            "SELECT count(*) FILTER (WHERE status <> 'PENDING'), count(*) FILTER (WHERE status = 'SUCCEEDED') "
            "FROM job_queue",
        ),
        System(
            # A finished pgqueuer job is deleted from its queue table (and logged).
            "pgqueuer", "run_pgqueuer.py", ("pgqueuer", "asyncpg"), "pgqueuer",
            "SELECT %(total)s - count(*) FILTER (WHERE status = 'queued'), %(total)s - count(*) FROM pgqueuer",
        ),
        System(
            "procrastinate", "run_procrastinate.py", ("procrastinate", "psycopg[binary,pool]"), "procrastinate",
            "SELECT count(*) FILTER (WHERE status <> 'todo'), count(*) FILTER (WHERE status = 'succeeded') "
            "FROM procrastinate_jobs",
        ),
    )
}


@dataclass
class Result:
    version: str = "?"
    processed: Optional[float] = None
    single: Optional[float] = None
    bulk: Optional[float] = None
    p50: Optional[float] = None
    p95: Optional[float] = None
    worker_ms: Optional[float] = None
    postgres_ms: Optional[float] = None
    notes: list[str] = field(default_factory=list)


DEFAULT_CONCURRENCY = "default"


def _concurrency(text: str) -> str:
    if text != DEFAULT_CONCURRENCY and not (text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"a positive number or {DEFAULT_CONCURRENCY!r}, not {text!r}")
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs drained per system")
    parser.add_argument("--runs", type=int, default=1, help="repeat everything; the table shows ranges")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--concurrency", type=_concurrency, default=DEFAULT_CONCURRENCY,
                        help="jobs in flight per worker, or 'default': each system's own default settings")
    parser.add_argument("--bulk-batch", type=int, default=5_000)
    parser.add_argument("--single-jobs", type=int, default=1_000)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--pgbench-clients", type=int, default=8)
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown, as docs/performance.md shows it")
    parser.add_argument("--peers-python", default=None, help="interpreter for the peers' venv (default: the newest found)")
    bench.add_database_option(parser)
    args = parser.parse_args()
    args.systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in args.systems if name not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    return args


# -- the peers' virtualenv ---------------------------------------------------------


def _works(python: str) -> bool:
    return subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0


def _peers_interpreter(requested: Optional[str]) -> str:
    """The interpreter for the peers' venv: some peers need a newer Python than ours."""
    if requested:
        return requested
    candidates = [shutil.which(f"python3.{minor}") for minor in (13, 12)]
    candidates += sorted(map(str, Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3")), reverse=True)
    return next((c for c in candidates if c and _works(c)), sys.executable)


def _importable(python: Path, module: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0


def peers_python(systems: list[System], requested: Optional[str]) -> tuple[Path, dict[str, str]]:
    """Create bench/.peers-venv if needed and install each missing peer; return it and why any failed."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        interpreter = _peers_interpreter(requested)
        print(f"creating {PEERS_VENV} with {interpreter}", flush=True)
        subprocess.run([interpreter, "-m", "venv", str(PEERS_VENV)], check=True)
    failures = {}
    for system in systems:
        if not system.packages or _importable(python, system.module):
            continue
        print(f"installing {' '.join(system.packages)} into {PEERS_VENV.name}", flush=True)
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *system.packages], capture_output=True, text=True)
        if pip.returncode != 0 or not _importable(python, system.module):
            failures[system.name] = (pip.stderr.strip().splitlines() or ["not importable"])[-1]
    return python, failures


# -- driving a runner ------------------------------------------------------------------


class Runner:
    def __init__(self, system: System, python: Path) -> None:
        self.system = system
        self.command = [str(python), str(RUNNERS_DIR / system.runner)]

    def call(self, *args: object) -> dict:
        done = subprocess.run([*self.command, *map(str, args)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{self.system.name} {args[0]} failed: {done.stderr.strip()[-2000:]}")
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    @contextlib.contextmanager
    def worker(self, url: str, concurrency: int | str, record: Optional[Path] = None) -> Iterator[subprocess.Popen]:
        """A running worker process, stopped with SIGTERM (its graceful stop) on exit."""
        with tempfile.TemporaryFile("w+") as errors:
            extra = [str(record)] if record else []
            process = subprocess.Popen(
                [*self.command, "work", url, str(concurrency), *extra], stdout=subprocess.PIPE, stderr=errors, text=True
            )
            try:
                if process.stdout.readline().strip() != "ready":
                    process.wait()
                    errors.seek(0)
                    raise RuntimeError(f"{self.system.name} worker did not start: {errors.read()[-2000:]}")
                yield process
            except RuntimeError as error:
                errors.seek(0)
                raise RuntimeError(f"{error}; its stderr ends: {errors.read()[-1500:]}") from error
            finally:
                _stop(process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Observer:
    """Polls a system's job table from outside; its own backend is left out of PostgreSQL CPU."""

    def __init__(self, url: str, system: System, total: int) -> None:
        self.connection = psycopg2.connect(url)
        self.connection.autocommit = True
        self.cursor = self.connection.cursor()
        self.system, self.total = system, total
        self.postgres = bench.PostgresCpu(url)
        self.postgres.exclude_backend(self.connection.get_backend_pid())

    def progress(self) -> tuple[int, int]:
        self.cursor.execute(self.system.progress_sql, {"total": self.total})
        return self.cursor.fetchone()

    def wait_until(self, index: int, count: int, deadline: float, workers: Sequence[subprocess.Popen] = ()) -> bool:
        """Poll until started (index 0) or finished (1) reaches ``count``; False at the deadline.

        Raises:
            RuntimeError: a worker process exited meanwhile, so the count would never come.
        """
        while self.progress()[index] < count:
            exited = [w.returncode for w in workers if w.poll() is not None]
            if exited:
                raise RuntimeError(f"a worker process exited early with status {exited[0]}")
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def close(self) -> None:
        self.connection.close()


# -- the phases ----------------------------------------------------------------------


@contextlib.contextmanager
def phase_database(srv: bench.Server, runner: Runner, phase: str) -> Iterator[str]:
    name = f"cmp_{runner.system.name.replace('-', '_')}_{phase}"
    with bench.fresh_database(srv, name) as url:
        plain = bench.libpq_url(url)
        runner.call("setup", plain)
        yield plain


def measure_drain(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "drain") as url:
        result.bulk = args.jobs / runner.call("bulk", url, args.jobs, args.bulk_batch)["seconds"]
        observer = Observer(url, runner.system, args.jobs)
        try:
            with runner.worker(url, args.concurrency) as process:
                window = bench.CpuWindow(lambda: bench.tree_cpu_seconds(process.pid), observer.postgres)
                if not observer.wait_until(0, 1, time.monotonic() + 120, [process]):
                    result.notes.append("no job started within 120 s")
                    return
                window.start()
                started = time.perf_counter()
                if not observer.wait_until(1, args.jobs, time.monotonic() + 1_800, [process]):
                    result.notes.append("drain did not finish within 30 min")
                    return
                elapsed = time.perf_counter() - started
                window.stop()
        finally:
            observer.close()
    result.processed = args.jobs / elapsed
    result.worker_ms, result.postgres_ms = window.per_job_ms(args.jobs)


def measure_single(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "single") as url:
        result.single = args.single_jobs / runner.call("single", url, args.single_jobs)["seconds"]


def measure_latency(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "latency") as url, tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "started.json"
        observer = Observer(url, runner.system, args.latency_jobs)
        try:
            with runner.worker(url, args.concurrency, record) as process:
                time.sleep(LATENCY_SETTLE_SECONDS)
                committed = runner.call("produce", url, args.latency_jobs, args.gap_ms)["committed"]
                if not observer.wait_until(1, args.latency_jobs, time.monotonic() + 60, [process]):
                    result.notes.append("latency jobs did not all finish within 60 s")
        finally:
            observer.close()
        started = {int(n): t for n, t in json.loads(record.read_text()).items()}
    latencies = [(started[n] - committed[n]) * 1000 for n in range(len(committed)) if n in started]
    result.p50, result.p95 = bench.percentile(latencies, 0.50), bench.percentile(latencies, 0.95)


def measure(srv: bench.Server, system: System, python: Path, args: argparse.Namespace) -> Result:
    runner = Runner(system, python)
    result = Result(version=runner.call("version")["version"])
    for step in (measure_drain, measure_single, measure_latency):
        try:
            step(srv, runner, args, result)
        except RuntimeError as error:
            result.notes.append(str(error).splitlines()[-1][:300])
    return result


# -- pgbench -----------------------------------------------------------------------------


def pgbench_binary() -> Optional[str]:
    """pgserver's own pgbench (the server's version) when present, else the one on PATH."""
    with contextlib.suppress(ImportError):
        import pgserver

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
        if bundled.exists():
            return str(bundled)
    return shutil.which("pgbench")


def measure_pgbench(srv: bench.Server, args: argparse.Namespace) -> Optional[float]:
    binary = pgbench_binary()
    if binary is None:
        return None
    with bench.fresh_database(srv, "cmp_pgbench") as url:
        connection = bench.pgbench_connection_args(url)
        subprocess.run([binary, "--initialize", "--scale=1", "--quiet", *connection], check=True, capture_output=True)
        run = subprocess.run(
            [binary, "--skip-some-updates", f"--client={args.pgbench_clients}", "--jobs=2",
             f"--time={args.pgbench_seconds}", *connection],
            check=True, capture_output=True, text=True,
        )
    found = re.search(r"tps = ([\d.]+)", run.stdout)
    return float(found.group(1)) if found else None


# -- report ------------------------------------------------------------------------------


def report(runs: list[dict[str, Result]], skipped: dict[str, str], tps: list[Optional[float]], args: argparse.Namespace) -> None:
    names = list(runs[0])
    ours = [r[OURS].processed for r in runs if OURS in r and r[OURS].processed]

    def column(name: str, attribute: str, digits: int = 0) -> str:
        return bench.fmt_range([getattr(r[name], attribute) for r in runs], digits)

    def ratio(name: str) -> str:
        theirs = [r[name].processed for r in runs if r[name].processed]
        return f"{fmean(ours) / fmean(theirs):.2f}x" if ours and theirs else "n/a"

    print(f"\njobs={args.jobs} concurrency={args.concurrency} runs={args.runs} bulk_batch={args.bulk_batch} "
          f"single_jobs={args.single_jobs} latency_jobs={args.latency_jobs} gap_ms={args.gap_ms:g}")
    headers = ["system", "version", "processed/s", "single enq/s", "bulk enq/s", "p50 ms", "p95 ms",
               "worker CPU ms/job", "PG CPU ms/job", "ours/this"]
    rows = [
        [name, runs[0][name].version, column(name, "processed"), column(name, "single"), column(name, "bulk"),
         column(name, "p50", 1), column(name, "p95", 1), column(name, "worker_ms", 3), column(name, "postgres_ms", 3),
         ratio(name)]
        for name in names
    ]
    bench.print_table(headers, rows)
    if args.markdown:
        # The form of docs/performance.md: pickup and CPU figures paired in one column each.
        print("\n| system | version | processed/s | single enqueue/s | bulk enqueue/s | pickup p50 / p95 ms "
              "| CPU ms/job worker / PostgreSQL | ours / this |\n|---|---|---|---|---|---|---|---|")
        for name, version, processed, single, bulk, p50, p95, worker, postgres, ratio_to_ours in rows:
            print(f"| {name} | {version} | {processed} | {single} | {bulk} | {p50} / {p95} | {worker} / {postgres} | {ratio_to_ours} |")
    known_tps = [t for t in tps if t]
    ratio_text = f"; ours processed / pgbench tps = {fmean(ours) / fmean(known_tps):.2f}" if ours and known_tps else ""
    print(f"pgbench -N ({args.pgbench_clients} clients, {args.pgbench_seconds} s): "
          f"{bench.fmt_range(tps)} tps{ratio_text}")
    for name in names:
        for note in sorted({note for r in runs for note in r[name].notes}):
            print(f"note: {name}: {note}")
    for name, reason in skipped.items():
        print(f"skipped: {name}: {reason}")


def main() -> int:
    args = parse_args()
    chosen = [SYSTEMS[name] for name in args.systems]
    python, skipped = peers_python([s for s in chosen if s.name != OURS], args.peers_python)
    interpreters = {s.name: Path(sys.executable) if s.name == OURS else python for s in chosen if s.name not in skipped}
    runs: list[dict[str, Result]] = []
    tps: list[Optional[float]] = []
    with bench.server(args.database_url) as srv:
        for run in range(args.runs):
            results = {}
            for name, interpreter in interpreters.items():
                print(f"run {run + 1}/{args.runs}: {name}", flush=True)
                results[name] = measure(srv, SYSTEMS[name], interpreter, args)
            runs.append(results)
            print(f"run {run + 1}/{args.runs}: pgbench -N", flush=True)
            tps.append(measure_pgbench(srv, args))
    report(runs, skipped, tps, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
