"""Run the same workloads on runledger-sync and its peers, on one PostgreSQL server in one run, and print a table.

Usage: python bench/compare.py [--jobs 10000] [--runs 1] [--systems runledger-sync,pgqueuer,procrastinate]
                               [--start fresh|prefilled] [--code PATH ...] [--database-url URL]
The peers are installed from PyPI into bench/.peers-venv on first use (gitignored).

Every system is driven the same way, through a runner under bench/peers/ that uses
its library's public API, in a process of its own, each phase in a fresh database:
  processed   N no-op jobs drained by one worker process, each system with its own default
              settings (--concurrency default) or all capped at N jobs in flight; timed from
              outside, by polling the system's own tables, from the first job seen started
              to the last seen finished. --start fresh (the default) starts the worker as a
              new deployment does: on a just-migrated database whose empty tables were
              analyzed, so it plans on empty tables; after it has idled a moment, another
              process inserts the N jobs in batches (--bulk-batch) as fast as it can, and
              PostgreSQL CPU leaves that process's backends out. --start prefilled inserts
              the N jobs before the worker starts.
  bulk        inserting N jobs in batches (--bulk-batch) with no worker running
  single      --single-jobs jobs inserted one call at a time from one thread
  latency     an idle worker (LISTEN/NOTIFY as each system does by default), jobs
              inserted one at a time 20 ms apart by another process: commit to handler start
  CPU/job     worker process tree and PostgreSQL server (from /proc) over the drain
              window, leaving out the backend of the polling observer; and the drain
              database's own backends alone, without the rest of a shared server's load
`pgbench -N` on the same server gives a yardstick for what the box can commit.

Our rows are measured once per --code tree (default: the tree this script is in), with
that tree alone on the runner's PYTHONPATH, labelled by its git short hash (or its
path), so old and new code run in turn under the same load.
"""

# ruff: noqa: S603  (every command is one of our interpreters and runners, argument lists, no shell)
from __future__ import annotations

import argparse
import contextlib
import json
import os
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
from typing import Callable, Iterator, Optional, Sequence

import _common as bench
import psycopg2

BENCH_DIR = Path(__file__).resolve().parent
RUNNERS_DIR = BENCH_DIR / "peers"
PEERS_VENV = BENCH_DIR / ".peers-venv"
OURS = "runledger-sync"
POLL_SECONDS = 0.005
STOP_TIMEOUT_SECONDS = 30
#: After "ready": the listener is connected and the first empty polls (and their plans) are done.
SETTLE_SECONDS = 1.0
FRESH, PREFILLED = "fresh", "prefilled"
#: The application_name of the connections that insert a fresh start's jobs, so their backends can be found.
INSERTER_APPLICATION = "bench-compare-insert"
#: Polls between two looks for new backends in pg_stat_activity (each poll reads the known ones' CPU).
LOOKUP_SAMPLES = 10


@dataclass(frozen=True)
class System:
    """One queue: its runner, what to pip-install, and how to count its started/finished jobs."""

    name: str
    runner: str
    packages: tuple[str, ...]
    module: str
    # Returns (started, finished) jobs, also while jobs are still being inserted.
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
            # A finished pgqueuer job is deleted from its queue table; its log keeps each pick and success.
            "pgqueuer", "run_pgqueuer.py", ("pgqueuer", "asyncpg"), "pgqueuer",
            "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'picked'), "
            "(SELECT count(*) FROM pgqueuer_log WHERE status = 'successful')",
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
    own_backends_ms: Optional[float] = None
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
    parser.add_argument("--start", choices=(FRESH, PREFILLED), default=FRESH,
                        help="fresh: the worker starts on empty, analyzed tables and the jobs come after it; "
                             "prefilled: the jobs are inserted before the worker starts")
    parser.add_argument("--code", action="append", default=[], metavar="PATH",
                        help=f"a source tree of {OURS} to measure (repeatable; default: the one this script is in)")
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
    args.code = [str(Path(tree).resolve()) for tree in args.code] or [str(BENCH_DIR.parent)]
    missing = [tree for tree in args.code if not (Path(tree) / OURS.replace("-", "_")).is_dir()]
    if missing:
        parser.error(f"no {OURS.replace('-', '_')} package in: {', '.join(missing)}")
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
    """One system's runner (or one tree of ours) as processes: its command, environment and row label."""

    def __init__(self, system: System, python: Path, label: str, environment: Optional[dict[str, str]] = None) -> None:
        self.system, self.label, self.environment = system, label, environment
        self.command = [str(python), str(RUNNERS_DIR / system.runner)]

    def call(self, *args: object) -> dict:
        return self.finish(self.start(*args))

    def start(self, *args: object) -> subprocess.Popen:
        """A runner command started in the background; :meth:`finish` waits for it."""
        return subprocess.Popen([*self.command, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.environment)

    def finish(self, process: subprocess.Popen) -> dict:
        """The JSON line a runner command printed last (none: ``{}``), once it has exited."""
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{self.label} {process.args[len(self.command)]} failed: {err.strip()[-2000:]}")
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    @contextlib.contextmanager
    def worker(self, url: str, concurrency: int | str, record: Optional[Path] = None) -> Iterator[subprocess.Popen]:
        """A running worker process, stopped with SIGTERM (its graceful stop) on exit."""
        with tempfile.TemporaryFile("w+") as errors:
            extra = [str(record)] if record else []
            process = subprocess.Popen(
                [*self.command, "work", url, str(concurrency), *extra], stdout=subprocess.PIPE, stderr=errors, text=True,
                env=self.environment,
            )
            try:
                if process.stdout.readline().strip() != "ready":
                    process.wait()
                    errors.seek(0)
                    raise RuntimeError(f"{self.label} worker did not start: {errors.read()[-2000:]}")
                yield process
            except RuntimeError as error:
                errors.seek(0)
                raise RuntimeError(f"{error}; its stderr ends: {errors.read()[-1500:]}") from error
            finally:
                _stop(process)


def tree_label(tree: str) -> str:
    """Our system's name with the tree's git short hash (``-dirty`` when tracked files differ), else its path."""
    git = shutil.which("git")
    head = git and subprocess.run([git, "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if not head or head.returncode != 0:
        return f"{OURS}@{tree}"
    clean = subprocess.run([git, "-C", tree, "diff", "--quiet", "HEAD"], capture_output=True).returncode == 0
    return f"{OURS}@{head.stdout.strip()}{'' if clean else '-dirty'}"


def our_runners(trees: Sequence[str]) -> list[Runner]:
    """A runner per tree, each importing ``runledger_sync`` from its tree alone (checked here)."""
    labels = [tree_label(tree) for tree in trees]
    if len(set(labels)) < len(labels):
        labels = [f"{OURS}@{tree}" for tree in trees]
    runners = []
    for tree, label in zip(trees, labels, strict=True):
        environment = dict(os.environ, PYTHONPATH=tree)
        found = subprocess.run([sys.executable, "-c", "import runledger_sync; print(runledger_sync.__file__)"],
                               capture_output=True, text=True, env=environment, cwd=RUNNERS_DIR)
        if found.returncode != 0:
            raise SystemExit(f"PYTHONPATH={tree} cannot import runledger_sync: {found.stderr.strip()[-1500:]}")
        if not Path(found.stdout.strip()).resolve().is_relative_to(tree):
            raise SystemExit(f"PYTHONPATH={tree} imports runledger_sync from {found.stdout.strip()}")
        runners.append(Runner(SYSTEMS[OURS], Path(sys.executable), label, environment))
    return runners


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

    def __init__(self, url: str, system: System) -> None:
        self.connection = psycopg2.connect(url)
        self.connection.autocommit = True
        self.cursor = self.connection.cursor()
        self.system = system
        self.postgres = bench.PostgresCpu(url)
        self.postgres.exclude_backend(self.connection.get_backend_pid())

    def progress(self) -> tuple[int, int]:
        self.cursor.execute(self.system.progress_sql)
        return self.cursor.fetchone()

    def wait_until(self, index: int, count: int, deadline: float, workers: Sequence[subprocess.Popen] = (),
                   each_poll: Callable[[], None] = lambda: None) -> bool:
        """Poll until started (index 0) or finished (1) reaches ``count``; False at the deadline.

        Raises:
            RuntimeError: a worker process exited meanwhile, so the count would never come.
        """
        while self.progress()[index] < count:
            each_poll()
            exited = [w.returncode for w in workers if w.poll() is not None]
            if exited:
                raise RuntimeError(f"a worker process exited early with status {exited[0]}")
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def close(self) -> None:
        self.connection.close()


class Backends:
    """CPU used by the backends of a local server that a pg_stat_activity condition finds, read from /proc.

    Each sample reads the CPU of every backend found so far (the last reading stands
    once one has exited) and, every LOOKUP_SAMPLES samples, looks for new ones; a
    backend that comes and goes between two lookups is missed.
    """

    def __init__(self, cursor: psycopg2.extensions.cursor, condition: str, *params: object) -> None:
        self.cursor, self.params = cursor, params
        # The condition is one of this script's constants; its values are bound.
        self.sql = f"SELECT pid FROM pg_stat_activity WHERE {condition} AND pid <> pg_backend_pid()"  # noqa: S608
        self.cpu: dict[int, float] = {}
        self.at_window_start: dict[int, float] = {}
        self.samples = 0

    def sample(self, *, look: bool = False) -> None:
        if look or self.samples % LOOKUP_SAMPLES == 0:
            self.cursor.execute(self.sql, self.params)
            for (pid,) in self.cursor.fetchall():
                self.cpu.setdefault(pid, 0.0)
        self.samples += 1
        for pid in self.cpu:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                self.cpu[pid] = bench.process_cpu_seconds(pid)

    def window_started(self) -> None:
        self.sample(look=True)
        self.at_window_start = dict(self.cpu)

    def seconds_in_window(self) -> float:
        """CPU they used since :meth:`window_started`."""
        self.sample(look=True)
        return sum(cpu - self.at_window_start.get(pid, 0.0) for pid, cpu in self.cpu.items())


class DrainCpu:
    """Worker and PostgreSQL CPU over a drain, sampled on every poll of the observer.

    PostgreSQL's is the whole server's less the backends inserting a fresh start's
    jobs; on a local server it is also given for the drain database's own backends
    alone (the worker's and its listener's), which leaves out other work on a shared
    server and the server's background processes.
    """

    def __init__(self, worker_pid: int, observer: Observer) -> None:
        self.window = bench.CpuWindow(lambda: bench.tree_cpu_seconds(worker_pid), observer.postgres)
        self.inserting, self.own = (
            Backends(observer.cursor, "application_name = %s", INSERTER_APPLICATION),
            Backends(observer.cursor, "datname = current_database() AND application_name <> %s", INSERTER_APPLICATION),
        ) if observer.postgres.available else (None, None)

    def _backends(self) -> list[Backends]:
        return [backends for backends in (self.inserting, self.own) if backends]

    def sample(self) -> None:
        for backends in self._backends():
            backends.sample()

    def start(self) -> None:
        self.window.start()
        for backends in self._backends():
            backends.window_started()

    def stop(self) -> None:
        self.window.stop()
        if self.inserting and self.window.postgres_seconds is not None:
            self.window.postgres_seconds -= self.inserting.seconds_in_window()
        self.own_seconds = self.own.seconds_in_window() if self.own else None

    def per_job_ms(self, jobs: int) -> tuple[float, Optional[float], Optional[float]]:
        """Worker, PostgreSQL and the drain database's own backends, CPU ms per job."""
        own = None if self.own_seconds is None else self.own_seconds * 1000 / jobs
        return (*self.window.per_job_ms(jobs), own)


class Inserter:
    """A fresh start's jobs, inserted by a runner process while the worker runs.

    Its connections carry INSERTER_APPLICATION as their application_name, so what
    their backends spend inside the drain window can be taken out of PostgreSQL's
    figure, which then counts the drain alone, as it does when the jobs were
    inserted first.
    """

    def __init__(self, runner: Runner, url: str, args: argparse.Namespace) -> None:
        separator = "&" if "?" in url else "?"
        self.runner = runner
        self.process = runner.start("bulk", f"{url}{separator}application_name={INSERTER_APPLICATION}",
                                    args.jobs, args.bulk_batch)

    def check(self) -> None:
        """Raises RuntimeError when the insert failed, so the jobs the drain waits for would never come."""
        if self.process.poll():
            self.runner.finish(self.process)

    def finish(self) -> float:
        """Seconds the insert took, once it has exited."""
        return self.runner.finish(self.process)["seconds"]

    def stop(self) -> None:
        _stop(self.process)


# -- the phases ----------------------------------------------------------------------


@contextlib.contextmanager
def phase_database(srv: bench.Server, runner: Runner, phase: str) -> Iterator[str]:
    # The pid keeps another run of this script on the same server from dropping this one's database.
    name = f"cmp_{runner.system.name.replace('-', '_')}_{phase}_{os.getpid()}"
    with bench.fresh_database(srv, name) as url:
        plain = bench.libpq_url(url)
        runner.call("setup", plain)
        yield plain


def analyze(url: str) -> None:
    """ANALYZE every table of the database, as autovacuum soon does to a new deployment's empty tables."""
    connection = psycopg2.connect(url)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    finally:
        connection.close()


def measure_drain(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "drain") as url:
        if args.start == PREFILLED:
            result.bulk = args.jobs / runner.call("bulk", url, args.jobs, args.bulk_batch)["seconds"]
        else:
            analyze(url)
        observer = Observer(url, runner.system)
        inserter: Optional[Inserter] = None
        try:
            with runner.worker(url, args.concurrency) as process:
                if args.start == FRESH:
                    time.sleep(SETTLE_SECONDS)
                    inserter = Inserter(runner, url, args)
                cpu = DrainCpu(process.pid, observer)

                def each_poll() -> None:
                    if inserter:
                        inserter.check()
                    cpu.sample()

                if not observer.wait_until(0, 1, time.monotonic() + 120, [process], each_poll):
                    result.notes.append("no job started within 120 s")
                    return
                cpu.start()
                started = time.perf_counter()
                if not observer.wait_until(1, args.jobs, time.monotonic() + 1_800, [process], each_poll):
                    result.notes.append("drain did not finish within 30 min")
                    return
                elapsed = time.perf_counter() - started
                cpu.stop()
            if inserter:
                inserting = inserter.finish()
                if inserting > elapsed / 2:
                    result.notes.append(f"the insert took {inserting:.2f} s of a {elapsed:.2f} s drain: it may have paced it")
        finally:
            observer.close()
            if inserter:
                inserter.stop()
    result.processed = args.jobs / elapsed
    result.worker_ms, result.postgres_ms, result.own_backends_ms = cpu.per_job_ms(args.jobs)


def measure_bulk(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "bulk") as url:
        result.bulk = args.jobs / runner.call("bulk", url, args.jobs, args.bulk_batch)["seconds"]


def measure_single(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "single") as url:
        result.single = args.single_jobs / runner.call("single", url, args.single_jobs)["seconds"]


def measure_latency(srv: bench.Server, runner: Runner, args: argparse.Namespace, result: Result) -> None:
    with phase_database(srv, runner, "latency") as url, tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "started.json"
        observer = Observer(url, runner.system)
        try:
            with runner.worker(url, args.concurrency, record) as process:
                time.sleep(SETTLE_SECONDS)
                committed = runner.call("produce", url, args.latency_jobs, args.gap_ms)["committed"]
                if not observer.wait_until(1, args.latency_jobs, time.monotonic() + 60, [process]):
                    result.notes.append("latency jobs did not all finish within 60 s")
        finally:
            observer.close()
        started = {int(n): t for n, t in json.loads(record.read_text()).items()}
    latencies = [(started[n] - committed[n]) * 1000 for n in range(len(committed)) if n in started]
    result.p50, result.p95 = bench.percentile(latencies, 0.50), bench.percentile(latencies, 0.95)


def measure(srv: bench.Server, runner: Runner, args: argparse.Namespace) -> Result:
    result = Result(version=runner.call("version")["version"])
    # A prefilled drain's insert is the bulk figure; a fresh start's runs beside the worker, so bulk runs alone.
    steps = (measure_drain, measure_single, measure_latency) if args.start == PREFILLED else (
        measure_drain, measure_bulk, measure_single, measure_latency)
    for step in steps:
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
    with bench.fresh_database(srv, f"cmp_pgbench_{os.getpid()}") as url:
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


def load_average() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def report(runs: list[dict[str, Result]], skipped: dict[str, str], tps: list[Optional[float]], args: argparse.Namespace) -> None:
    labels = list(runs[0])
    trees = [label for label in labels if label.startswith(f"{OURS}@")]
    peers = [label for label in labels if label not in trees]

    def figures(label: str, attribute: str) -> list[float]:
        return [getattr(r[label], attribute) for r in runs if getattr(r[label], attribute)]

    def column(label: str, attribute: str, digits: int = 0) -> str:
        return bench.fmt_range([getattr(r[label], attribute) for r in runs], digits)

    def ratio(label: str, to: str, attribute: str = "processed") -> str:
        ours, theirs = figures(label, attribute), figures(to, attribute)
        return f"{fmean(ours) / fmean(theirs):.2f}x" if ours and theirs else "n/a"

    print(f"\njobs={args.jobs} start={args.start} concurrency={args.concurrency} runs={args.runs} "
          f"bulk_batch={args.bulk_batch} single_jobs={args.single_jobs} latency_jobs={args.latency_jobs} "
          f"gap_ms={args.gap_ms:g} load_average_now={load_average()}")
    headers = ["system", "version", "processed/s", "single enq/s", "bulk enq/s", "p50 ms", "p95 ms",
               "worker CPU ms/job", "PG CPU ms/job", "its backends' ms/job", "ours/this"]
    rows = [
        [label, runs[0][label].version, column(label, "processed"), column(label, "single"), column(label, "bulk"),
         column(label, "p50", 1), column(label, "p95", 1), column(label, "worker_ms", 3),
         column(label, "postgres_ms", 3), column(label, "own_backends_ms", 3), ratio(trees[0], label) if trees else "n/a"]
        for label in labels
    ]
    bench.print_table(headers, rows)
    if args.markdown:
        # The form of docs/performance.md: pickup and CPU figures paired in one column each.
        print("\n| system | version | processed/s | single enqueue/s | bulk enqueue/s | pickup p50 / p95 ms "
              "| CPU ms/job worker / PostgreSQL | ours / this |\n|---|---|---|---|---|---|---|---|")
        for label, version, processed, single, bulk, p50, p95, worker, postgres, _, ratio_to_ours in rows:
            print(f"| {label} | {version} | {processed} | {single} | {bulk} | {p50} / {p95} | {worker} / {postgres} | {ratio_to_ours} |")
    for tree in trees:
        for peer in peers:
            print(f"{tree} / {peer}: processed {ratio(tree, peer)}, single enqueue {ratio(tree, peer, 'single')}, "
                  f"bulk enqueue {ratio(tree, peer, 'bulk')}")
    known_tps = [t for t in tps if t]
    ours = figures(trees[0], "processed") if trees else []
    ratio_text = f"; {trees[0]} processed / pgbench tps = {fmean(ours) / fmean(known_tps):.2f}" if ours and known_tps else ""
    print(f"pgbench -N ({args.pgbench_clients} clients, {args.pgbench_seconds} s): "
          f"{bench.fmt_range(tps)} tps{ratio_text}")
    for label in labels:
        for note in sorted({note for r in runs for note in r[label].notes}):
            print(f"note: {label}: {note}")
    for name, reason in skipped.items():
        print(f"skipped: {name}: {reason}")


def main() -> int:
    args = parse_args()
    chosen = [SYSTEMS[name] for name in args.systems]
    python, skipped = peers_python([s for s in chosen if s.name != OURS], args.peers_python)
    runners = []
    for system in chosen:
        if system.name == OURS:
            runners += our_runners(args.code)
        elif system.name not in skipped:
            runners.append(Runner(system, python, system.name))
    runs: list[dict[str, Result]] = []
    tps: list[Optional[float]] = []
    with bench.server(args.database_url) as srv:
        for run in range(args.runs):
            results = {}
            for runner in runners:
                print(f"run {run + 1}/{args.runs}: {runner.label} (load average {load_average()})", flush=True)
                results[runner.label] = measure(srv, runner, args)
            runs.append(results)
            print(f"run {run + 1}/{args.runs}: pgbench -N (load average {load_average()})", flush=True)
            tps.append(measure_pgbench(srv, args))
    report(runs, skipped, tps, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
