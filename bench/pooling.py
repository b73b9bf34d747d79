"""Print jobs/s and idle pickup latency directly and through PgBouncer, in the pool mode given.

Usage: python bench/pooling.py [--via direct|pgbouncer] [--pgbouncer-mode transaction|session]
                               [--pool-mode session|transaction] [--jobs 2000] [--samples 40]
Jobs are enqueued one per call by 12 threads, then one worker (16 at once, the
default 500 ms poll) drains them; jobs/s counts from the worker's start to the
last success. Pickup is then read from the database clock, enqueue
(``created_at``) to claim (``leased_at``), for jobs enqueued one at a time to the
idle worker. ``--via pgbouncer`` starts the system's pgbouncer (pool size 4 in
transaction mode, 60 in session mode) in
front of an embedded PostgreSQL; as root it runs as the server's socket owner.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import _common as bench
import sqlalchemy

import runledger_sync as rl

ENQUEUE_THREADS = 12
CONCURRENCY = 16
#: Server connections per database: 4 as in transaction mode's tests; session mode
#: holds one per client for the client's life, so it needs one for each.
POOL_SIZE = {"transaction": 4, "session": 60}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=("direct", "pgbouncer"), default="pgbouncer")
    parser.add_argument("--pgbouncer-mode", choices=("transaction", "session"), default="transaction")
    parser.add_argument("--pool-mode", choices=[mode.value for mode in rl.PoolMode], default="transaction")
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--samples", type=int, default=40)
    return parser.parse_args()


@contextlib.contextmanager
def pgbouncer(direct_url: str, mode: str) -> Iterator[int]:
    """Run pgbouncer in front of ``direct_url``'s server; yield its port."""
    executable = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    parsed = sqlalchemy.engine.make_url(direct_url)
    host, backend_port = parsed.query.get("host") or parsed.host, parsed.query.get("port") or parsed.port or 5432
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = Path(tempfile.mkdtemp(prefix="rl-bench-pgbouncer-"))
    (directory / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={backend_port} user=postgres\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = any\n"
        f"pool_mode = {mode}\ndefault_pool_size = {POOL_SIZE[mode]}\nmax_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits,options\nlogfile = /dev/null\n"
    )
    user = []
    if os.geteuid() == 0:  # pgbouncer refuses root; the embedded server's socket is its owner's only
        owner = pwd.getpwuid(os.stat(str(host)).st_uid).pw_name if str(host).startswith("/") else "nobody"
        os.chown(directory, pwd.getpwnam(owner).pw_uid, -1)
        user = ["-u", owner]
    command = [executable, *user, str(directory / "pgbouncer.ini")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603 - pgbouncer and our own config file
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def enqueue_from_threads(engine: sqlalchemy.engine.Engine, jobs: int) -> int:
    failures = []

    def share(numbers: range) -> None:
        for n in numbers:
            try:
                rl.enqueue(engine, bench.NOOP_TYPE, {"n": n})
            except rl.RunledgerError as error:
                failures.append(error)

    threads = [threading.Thread(target=share, args=(range(t, jobs, ENQUEUE_THREADS),)) for t in range(ENQUEUE_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(failures)


def pickups_ms(engine: sqlalchemy.engine.Engine, samples: int) -> list[float]:
    ids = []
    for n in range(samples):
        time.sleep(random.uniform(0.1, 0.4))  # noqa: S311 - spread over the poll cycle
        ids.append(rl.enqueue(engine, bench.NOOP_TYPE, {"pickup": n}).id)
    while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < len(ids):
        time.sleep(0.05)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text(
            "SELECT extract(epoch FROM a.leased_at - q.created_at) * 1000 FROM job_queue q "
            "JOIN job_attempts a ON a.job_id = q.id WHERE q.id = ANY(:ids)"), {"ids": ids}).scalars().all()
    return [float(row) for row in rows]


def run(url: str, args: argparse.Namespace) -> None:
    engine = rl.create_engine(url, pool_mode=args.pool_mode, pool_size=CONCURRENCY + 4)
    registry = bench.noop_registry()
    try:
        registry.sync_definitions(engine)
        failed = enqueue_from_threads(engine, args.jobs)
        shutdown = threading.Event()
        config = rl.JobsConfig(max_global_concurrency=CONCURRENCY)
        worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
        started = time.perf_counter()
        worker.start()
        while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < args.jobs - failed:
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        time.sleep(1.0)  # idle: the listener (if any) is connected and probed
        latencies = sorted(pickups_ms(engine, args.samples))
        shutdown.set()
        worker.join()
    finally:
        engine.dispose()
    print(f"via={args.via}" + (f" pgbouncer_mode={args.pgbouncer_mode}" if args.via == "pgbouncer" else "")
          + f" pool_mode={args.pool_mode} jobs={args.jobs} enqueue_failures={failed}")
    print(f"processed: {(args.jobs - failed) / elapsed:,.0f} jobs/s ({elapsed:.2f} s)")
    print(f"idle pickup ms: p50={bench.percentile(latencies, 0.50):.1f} p95={bench.percentile(latencies, 0.95):.1f} "
          f"max={max(latencies):.1f} (poll_interval_ms={config.poll_interval_ms})")


def main() -> int:
    args = parse_args()
    rl.configure_logging(level="WARNING")
    with bench.server(None) as srv, bench.fresh_database(srv, "bench_pooling") as direct_url:
        migrator = rl.create_engine(direct_url)
        rl.migrate(migrator)
        migrator.dispose()
        if args.via == "direct":
            run(direct_url, args)
            return 0
        with pgbouncer(direct_url, args.pgbouncer_mode) as port:
            database = sqlalchemy.engine.make_url(direct_url).database
            run(f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
