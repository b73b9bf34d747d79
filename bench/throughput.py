"""Print how fast one worker drains N pre-inserted no-op jobs, its CPU and PostgreSQL's per job, and its RSS.

Usage: python bench/throughput.py [--jobs 10000] [--concurrency 32] [--batch 16] [--database-url URL]
       python bench/throughput.py --memory      # RSS after 20,000 and after 200,000 jobs (target: <10% growth)
       python bench/throughput.py --job-ms 100  # jobs that sleep 100 ms: compared with concurrency / duration
       python bench/throughput.py --processes 2 --job-cpu-ms 5 --concurrency 4 --jobs 3000
       python bench/throughput.py --metrics     # with the Prometheus observer (runledger_sync.metrics)
       python bench/throughput.py --otel        # traced (runledger_sync.contrib.opentelemetry, SDK, spans dropped)
The worker runs in this process (a thread, as an embedding application runs it);
its CPU is this process's minus the main thread's. With no URL an embedded
PostgreSQL is started in a temporary directory.

With --processes or --job-cpu-ms, each job burns that much of its thread's CPU,
and rl.Supervisor(processes=N) runs the worker: in this process for N = 1, in N
spawned worker processes otherwise (their CPU is added in). Those runs are timed
from 10% to 90% of the jobs done, so starting the processes is not counted.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import resource
import sys
import threading
import time

import _common as bench
import _cpu_app

import runledger_sync as rl

MEMORY_JOBS = 200_000
MEMORY_EARLY = 20_000
#: How often a supervised run counts finished jobs (each count costs PostgreSQL a little CPU).
POLL_SECONDS = 0.1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help=f"default 10000, or {MEMORY_JOBS:,} with --memory")
    parser.add_argument("--concurrency", type=int, default=rl.JobsConfig().max_global_concurrency)
    parser.add_argument("--batch", type=int, default=rl.JobsConfig().claim_batch_size)
    parser.add_argument("--job-ms", type=float, default=0.0, help="each job sleeps this long (default: no-op)")
    parser.add_argument("--processes", type=int, default=None, help="run rl.Supervisor(processes=N) (default: one thread)")
    parser.add_argument("--job-cpu-ms", type=float, default=0.0, help="each job burns this much CPU first")
    parser.add_argument("--memory", action="store_true", help=f"sample RSS after {MEMORY_EARLY:,} jobs and at the end")
    parser.add_argument("--event-log", default="full", choices=["full", "transitions"],
                        help="JobsConfig.event_log: transitions writes no LEASED, running or HEARTBEAT event rows")
    parser.add_argument("--metrics", action="store_true",
                        help="give the worker a runledger_sync.metrics.WorkerMetrics observer (prometheus_client)")
    parser.add_argument("--otel", action="store_true",
                        help="instrument with runledger_sync.contrib.opentelemetry: an SDK tracer provider whose "
                             "batch processor hands every span to an exporter that drops it (opentelemetry-sdk)")
    bench.add_database_option(parser)
    args = parser.parse_args()
    if args.jobs is None:
        args.jobs = MEMORY_JOBS if args.memory else 10_000
    if args.memory and args.jobs <= MEMORY_EARLY:
        parser.error(f"--memory needs more than {MEMORY_EARLY:,} jobs")
    return args


class Progress:
    """Counts handler calls; notes RSS at the early mark and signals the last job."""

    def __init__(self, total: int, job_seconds: float) -> None:
        self.total = total
        self.job_seconds = job_seconds
        self.rss_at: dict[int, float] = {}
        self.all_ran = threading.Event()
        self._count = itertools.count(1)  # next() on a count is atomic under the GIL

    def ran(self, _payload: dict) -> None:
        if self.job_seconds:
            time.sleep(self.job_seconds)
        n = next(self._count)
        if n in (MEMORY_EARLY, self.total):
            self.rss_at[n] = bench.rss_mib(os.getpid())
        if n == self.total:
            self.all_ran.set()


def drain(engine, registry: rl.JobRegistry, config: rl.JobsConfig, progress: Progress, window: bench.CpuWindow,
          observer: object = None) -> float:
    shutdown = threading.Event()
    worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown),
                              kwargs={"observer": observer})
    window.start()
    started = time.perf_counter()
    worker.start()
    progress.all_ran.wait()
    while rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) < progress.total:
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    window.stop()
    shutdown.set()
    worker.join()
    return elapsed


def workers_cpu_seconds() -> float:
    """CPU of this process but its main thread, and of its worker processes (none starts or stops mid-window)."""
    children = sum(bench.process_cpu_seconds(child.pid) for child in multiprocessing.active_children())
    return bench.process_cpu_seconds(os.getpid()) - time.thread_time() + children


def drain_supervised(engine, url: str, config: rl.JobsConfig, args: argparse.Namespace) -> tuple[int, float, bench.CpuWindow]:
    """Run rl.Supervisor(processes=N) over the queue; return the jobs done from 10% to 90%, the seconds and CPU."""
    os.environ[_cpu_app.CPU_MS_VARIABLE] = str(args.job_cpu_ms)
    supervisor = rl.Supervisor(engine, _cpu_app.make_registry(), config, processes=args.processes,
                               app="_cpu_app:make_registry", run_scheduler=False)
    window = bench.CpuWindow(workers_cpu_seconds, bench.PostgresCpu(url))
    low, high = args.jobs // 10, args.jobs - args.jobs // 10
    supervisor.start()
    try:
        done = 0
        while done < low:
            time.sleep(POLL_SECONDS)
            done = rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED)
        window.start()
        started, first = time.perf_counter(), done
        while done < high:
            time.sleep(POLL_SECONDS)
            done = rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED)
        elapsed = time.perf_counter() - started
        window.stop()
    finally:
        supervisor.stop(timeout=60)
    return done - first, elapsed, window


def report_supervised(args: argparse.Namespace, jobs: int, elapsed: float, window: bench.CpuWindow) -> None:
    rate = jobs / elapsed
    worker_ms, postgres_ms = window.per_job_ms(jobs)
    print(f"jobs={args.jobs} processes={args.processes} concurrency={args.concurrency} per process "
          f"batch={args.batch} job_cpu_ms={args.job_cpu_ms:g}")
    print(f"processed:    {rate:,.0f} jobs/s (10% to 90% of the jobs)")
    print(f"CPU per job:  worker {worker_ms:.3f} ms, PostgreSQL {bench.fmt(postgres_ms, 3)} ms")


def report(args: argparse.Namespace, enqueue_seconds: float, elapsed: float, window: bench.CpuWindow, progress: Progress) -> None:
    worker_ms, postgres_ms = window.per_job_ms(args.jobs)
    print(f"jobs={args.jobs} concurrency={args.concurrency} batch={args.batch} job_ms={args.job_ms:g}"
          f"{' metrics=on' if args.metrics else ''}{' otel=on' if args.otel else ''}")
    print(f"enqueue_many: {args.jobs / enqueue_seconds:,.0f} jobs/s")
    print(f"processed:    {args.jobs / elapsed:,.0f} jobs/s ({elapsed:.2f} s)")
    if args.job_ms:
        ideal = args.concurrency * 1000 / args.job_ms
        print(f"jobs of {args.job_ms:g} ms: {100 * args.jobs / elapsed / ideal:.0f}% of concurrency / duration "
              f"({ideal:,.0f} jobs/s; target within 10%)")
    print(f"CPU per job:  worker {worker_ms:.3f} ms, PostgreSQL {bench.fmt(postgres_ms, 3)} ms")
    print(f"worker peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.memory:
        early, late = progress.rss_at[MEMORY_EARLY], progress.rss_at[args.jobs]
        print(f"worker RSS: {early:.1f} MiB after {MEMORY_EARLY:,} jobs, {late:.1f} MiB after {args.jobs:,} "
              f"(growth {100 * (late - early) / early:+.1f}%, target < 10%)")


def _instrument(args: argparse.Namespace) -> None:
    if not args.otel:
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from runledger_sync.contrib.opentelemetry import instrument

    class Dropped(SpanExporter):
        """Exports nothing: the run measures making the spans, not sending them."""

        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    instrument(tracer_provider=provider)


def _observer(args: argparse.Namespace) -> object:
    if not args.metrics:
        return None
    from runledger_sync.metrics import WorkerMetrics

    return WorkerMetrics()


def main() -> int:
    args = parse_args()
    progress = Progress(args.jobs, args.job_ms / 1000)
    registry = bench.noop_registry(progress.ran)
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_throughput") as url:
        engine = bench.migrated_engine(url, pool_size=args.concurrency + 4)
        try:
            registry.sync_definitions(engine)
            # Before the enqueue, so the jobs carry a trace context as an instrumented application's do.
            _instrument(args)
            enqueue_seconds = bench.enqueue_noops(engine, args.jobs)
            window = bench.CpuWindow(
                lambda: bench.process_cpu_seconds(os.getpid()) - time.thread_time(), bench.PostgresCpu(url)
            )
            config = rl.JobsConfig(max_global_concurrency=args.concurrency, claim_batch_size=args.batch,
                                   event_log=args.event_log)
            if args.processes is not None or args.job_cpu_ms:
                args.processes = args.processes or 1
                report_supervised(args, *drain_supervised(engine, url, config, args))
                return 0
            elapsed = drain(engine, registry, config, progress, window, observer=_observer(args))
            report(args, enqueue_seconds, elapsed, window, progress)
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
