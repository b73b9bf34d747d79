"""Prometheus metrics: queue gauges read from the database on each scrape, worker counters kept in process.

``runledger-sync worker --metrics-port 9100`` serves both at ``/metrics``, and the
supervisor's liveness at ``/livez`` (``/health`` is its alias) and readiness at
``/readyz``, on 127.0.0.1 unless ``--metrics-host`` says otherwise. In your own process::

    from prometheus_client import make_wsgi_app
    from runledger_sync.metrics import WorkerMetrics, registry_for

    metrics = WorkerMetrics()
    supervisor = rl.Supervisor(engine, registry, config, observer=metrics)
    app = make_wsgi_app(registry_for(engine, worker=metrics))   # mount it where you like

With ``processes=N`` the worker processes count into a private directory (mode 0700)
of prometheus_client's multiprocess mode, and the parent's scrape sums them.

The queue gauges cost two statements per scrape: by job type
(:func:`runledger_sync.store.admin.gauges.queue_gauges` says which indexes it reads) and by
queue, with each queue's pause and limits (:func:`runledger_sync.store.queues.queue_loads`,
``runledger_queue_*`` gauges with a ``queue`` label). The worker's counters cost nothing when no
observer is given, and a few counter and histogram updates per job when one is.
prometheus_client is the ``metrics`` extra: without it, this module still
imports, and the functions that need it raise :class:`MissingExtra`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from runledger_sync.core.errors import MissingExtra, RunledgerError
from runledger_sync.core.evidence import bounded_error_type, error_type_of
from runledger_sync.core.flow import QueueLoad
from runledger_sync.core.records import JobRecord
from runledger_sync.core.types import JobFailure
from runledger_sync.logging import get_logger
from runledger_sync.runtime.health import SupervisorHealth
from runledger_sync.store.admin.gauges import (
    DEAD_LETTER_WINDOW_SECONDS,
    LATE_SCHEDULE_SECONDS,
    QueueGauges,
    queue_gauges,
)
from runledger_sync.store.queues import queue_loads

log = get_logger(__name__)

HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
PICKUP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
#: The outcome under which a job's end counts as a lease loss too.
LEASE_LOST = "lease_lost"
#: Loopback: the port has no authentication, so reaching it from elsewhere is the operator's choice.
DEFAULT_METRICS_HOST = "127.0.0.1"
#: Liveness (the loops), its alias, and readiness (the loops and the database).
LIVENESS_PATHS = ("/livez", "/health")
READINESS_PATH = "/readyz"
#: Where prometheus_client's multiprocess mode keeps its files (read when a metric is made).
MULTIPROCESS_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
MULTIPROCESS_DIR_PREFIX = "runledger-metrics-"


def _prometheus() -> ModuleType:
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 - the metric families of a custom collector
    except ImportError:
        raise MissingExtra("metrics", "prometheus_client") from None
    return prometheus_client


class WorkerMetrics:
    """The worker's counters and histograms: give it to ``Supervisor(observer=...)`` and to :func:`registry_for`.

    It is a :class:`runledger_sync.runtime.observer.WorkerObserver` and a
    Prometheus collector. Its metrics belong to no registry until you register it.
    With ``processes > 1`` it is a :class:`~runledger_sync.runtime.observer.ProcessesObserver`:
    it collects what the worker processes counted (a restarted one's counts are kept),
    and :meth:`close`, or the interpreter's exit, removes their directory.

    Raises:
        MissingExtra: prometheus_client is not installed.
    """

    def __init__(self) -> None:
        client = _prometheus()
        self.jobs = client.Counter("runledger_jobs", "Attempts ended, by job type and outcome.",
                                   ["job_type", "outcome"], registry=None)
        self.handler_seconds = client.Histogram(
            "runledger_job_handler_duration_seconds", "Time in the handler, per attempt that ran it.",
            ["job_type"], buckets=HANDLER_BUCKETS, registry=None)
        self.pickup_seconds = client.Histogram(
            "runledger_job_pickup_latency_seconds", "From a job's due time (enqueue, run_at or retry) to its claim.",
            ["job_type"], buckets=PICKUP_BUCKETS, registry=None)
        self.claim_batch = client.Histogram(
            "runledger_claim_batch_jobs", "Jobs returned by one claim that found any.", buckets=SIZE_BUCKETS, registry=None)
        self.group_size = client.Histogram(
            "runledger_group_write_jobs", "Jobs written by one group write.", ["writer"], buckets=SIZE_BUCKETS,
            registry=None)
        self.group_seconds = client.Histogram(
            "runledger_group_write_duration_seconds", "Duration of one group write's transaction.", ["writer"],
            buckets=WRITE_BUCKETS, registry=None)
        self.heartbeat_failures = client.Counter(
            "runledger_heartbeat_failures", "Lease renewals that failed (retried or given up).", ["job_type"],
            registry=None)
        self.lease_losses = client.Counter(
            "runledger_lease_losses", "Attempts that lost their lease (nothing written; the reaper recovers them).",
            ["job_type"], registry=None)
        self.failures = client.Counter(
            "runledger_job_failures", "Failed attempts recorded, by job type and the exception's type.",
            ["job_type", "error_type"], registry=None)
        # Label children looked up once: a job's end then costs a dict read per metric.
        self._children: dict[tuple[Any, ...], Any] = {}
        self._directory: Optional[str] = None
        self._remove: Optional[weakref.finalize] = None
        self._lock = threading.Lock()

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def claimed(self, jobs: Sequence[JobRecord]) -> None:
        if not jobs:
            return  # an idle worker's polls would bury the batch sizes under zeros
        self.claim_batch.observe(len(jobs))
        for job in jobs:
            # Both times come from the database clock: the claim sets last_heartbeat_at to its now().
            if job.last_heartbeat_at is not None:
                waited = (job.last_heartbeat_at - job.next_run_at).total_seconds()
                self._child(self.pickup_seconds, job.job_type).observe(max(0.0, waited))

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Optional[float]) -> None:
        self._child(self.jobs, job_type, outcome).inc()
        if handler_seconds is not None:
            self._child(self.handler_seconds, job_type).observe(handler_seconds)
        if outcome == LEASE_LOST:
            self._child(self.lease_losses, job_type).inc()

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        self._child(self.group_size, writer).observe(size)
        self._child(self.group_seconds, writer).observe(seconds)

    def heartbeat_failed(self, job_type: str) -> None:
        self._child(self.heartbeat_failures, job_type).inc()

    def attempt_failed(self, job_type: str, failure: JobFailure, exception: Optional[BaseException]) -> None:
        # No exception (a timeout, an invalid result): the failure's code names it instead.
        error_type = failure.code if exception is None else bounded_error_type(error_type_of(exception))
        self._child(self.failures, job_type, error_type).inc()

    @property
    def directory(self) -> Optional[str]:
        """Where the worker processes count, from their start until :meth:`close` (None without processes)."""
        return self._directory

    def worker_process_observer(self) -> Callable[[], "WorkerMetrics"]:
        """Make the worker processes' directory (once); return what each process calls for its WorkerMetrics."""
        with self._lock:
            if self._directory is None:
                self._directory = tempfile.mkdtemp(prefix=MULTIPROCESS_DIR_PREFIX)
                # At interpreter exit too, for a parent that never calls close().
                self._remove = weakref.finalize(self, shutil.rmtree, self._directory, ignore_errors=True)
            return functools.partial(_in_worker_process, self._directory)

    def worker_process_exited(self, pid: int) -> None:
        directory = self._directory
        if directory is not None and os.path.isdir(directory):
            # Drops the process's live gauges; its counters stay in the sums.
            from prometheus_client.multiprocess import mark_process_dead

            try:
                mark_process_dead(pid, directory)
            except OSError as error:  # bookkeeping of metrics must never stop the workers' monitor
                log.warning("metrics of an exited worker process not cleared", extra={"pid": pid, "error": str(error)})

    def close(self) -> None:
        """Remove the worker processes' directory, and their counts with it; without processes, nothing."""
        with self._lock:
            remove, self._remove, self._directory = self._remove, None, None
        if remove is not None:
            remove()

    def collect(self) -> Iterator[Any]:
        directory = self._directory
        if directory is not None:
            # The parent of worker processes runs no job: every count is in their files.
            from prometheus_client.multiprocess import MultiProcessCollector

            yield from MultiProcessCollector(None, path=directory).collect()
            return
        for metric in (self.jobs, self.handler_seconds, self.pickup_seconds, self.claim_batch, self.group_size,
                       self.group_seconds, self.heartbeat_failures, self.lease_losses, self.failures):
            yield from metric.collect()


def _in_worker_process(directory: str) -> WorkerMetrics:
    """A worker process's WorkerMetrics, counting into files of ``directory`` that its parent reads."""
    os.environ[MULTIPROCESS_VARIABLE] = directory
    from prometheus_client import values
    # prometheus_client picks where values live when it is first imported, which
    # may have happened in this process before it knew the directory.
    values.ValueClass = values.get_value_class()
    return WorkerMetrics()


class QueueCollector:
    """Reads :func:`~runledger_sync.store.admin.gauges.queue_gauges` and :func:`~runledger_sync.store.queues.queue_loads`
    on each scrape and turns them into gauges.

    A failed read is logged and reported as ``runledger_queue_up 0``, never as an
    error of the whole scrape, so the worker's own counters are still collected.
    """

    def __init__(self, bind: Any) -> None:
        self.bind = bind
        self._core = _prometheus().core

    def collect(self) -> Iterator[Any]:
        core = self._core
        started = time.monotonic()
        loads: list[QueueLoad] = []
        try:
            read: Optional[QueueGauges] = queue_gauges(self.bind)
            loads = queue_loads(self.bind)
        except RunledgerError as error:
            log.warning("queue metrics could not be read", extra={"error": str(error)})
            read = None
        yield core.GaugeMetricFamily("runledger_queue_up", "1 when the last scrape read the queue, else 0.",
                                     value=0 if read is None else 1)
        yield core.GaugeMetricFamily("runledger_queue_scrape_duration_seconds",
                                     "How long the scrape's queue read took.", value=time.monotonic() - started)
        if read is not None:
            yield from _queue_families(core, read)
            yield from _flow_families(core, loads)


def _queue_families(core: Any, read: QueueGauges) -> Iterable[Any]:
    def by_type(name: str, documentation: str, values: dict[str, Any]) -> Any:
        family = core.GaugeMetricFamily(name, documentation, labels=["job_type"])
        for job_type in sorted(set(read.job_types) | set(values)):
            family.add_metric([job_type], values.get(job_type, 0))
        return family

    jobs = core.GaugeMetricFamily("runledger_queue_jobs", "Unfinished jobs, by job type and status (PENDING, LEASED).",
                                  labels=["job_type", "status"])
    for job_type in sorted(set(read.job_types) | {job_type for job_type, _ in read.jobs}):
        for status in ("PENDING", "LEASED"):
            jobs.add_metric([job_type, status], read.jobs.get((job_type, status), 0))
    yield jobs
    yield by_type("runledger_queue_due_jobs", "PENDING jobs whose run time has come.", read.due)
    yield by_type("runledger_queue_oldest_due_age_seconds", "How long the longest-waiting due job has been due.",
                  read.oldest_due_age_seconds)
    yield by_type("runledger_queue_expired_leases", "LEASED jobs whose lease ran out (the reaper's work).",
                  read.expired_leases)
    yield by_type("runledger_dead_letters_recent",
                  f"Jobs dead-lettered in the last {DEAD_LETTER_WINDOW_SECONDS} seconds.", read.dead_lettered_recently)
    yield core.GaugeMetricFamily("runledger_schedules_late",
                                 f"Active schedules due for more than {LATE_SCHEDULE_SECONDS} seconds.",
                                 value=read.late_schedules)
    yield core.GaugeMetricFamily("runledger_schedules_max_lateness_seconds",
                                 "How long the most overdue active schedule has been due (0: none is due).",
                                 value=read.max_schedule_lateness_seconds or 0.0)


def _flow_families(core: Any, loads: Sequence[QueueLoad]) -> Iterable[Any]:
    """One gauge per queue (label ``queue``): its waiting and running jobs, its pause, its limits.

    A limit's gauge has no sample for a queue without that limit: absent means
    unlimited, so ``leased / global_limit`` is only computed where it means something.
    """
    def by_queue(name: str, documentation: str, value: Callable[[QueueLoad], Any]) -> Any:
        family = core.GaugeMetricFamily(name, documentation, labels=["queue"])
        for load in loads:
            if value(load) is not None:
                family.add_metric([load.queue.name], value(load))
        return family

    def rate(load: QueueLoad) -> Any:
        return load.queue.rate_limit

    yield by_queue("runledger_queue_ready_jobs", "PENDING jobs that are due and free to claim, by queue.",
                   lambda load: load.ready)
    yield by_queue("runledger_queue_blocked_jobs",
                   "PENDING due jobs held back by a busy concurrency key (key_limit reached), by queue.",
                   lambda load: load.blocked_by_key)
    yield by_queue("runledger_queue_scheduled_jobs", "PENDING jobs not due yet (delayed or retrying later), by queue.",
                   lambda load: load.scheduled)
    yield by_queue("runledger_queue_leased_jobs", "LEASED (running) jobs, by queue.", lambda load: load.leased)
    yield by_queue("runledger_queue_paused", "1 while the queue is paused (no worker claims its jobs), else 0.",
                   lambda load: int(load.queue.paused))
    yield by_queue("runledger_queue_global_limit", "Most jobs of the queue running at once across every worker "
                   "(no sample: no limit).", lambda load: load.queue.global_limit)
    yield by_queue("runledger_queue_key_limit", "Most jobs per concurrency key running (or next in line) at once "
                   "(no sample: no limit).", lambda load: load.queue.key_limit)
    yield by_queue("runledger_queue_rate_limit", "Most claims of the queue per rate window (no sample: no rate limit).",
                   lambda load: None if rate(load) is None else rate(load).count)
    yield by_queue("runledger_queue_rate_window_seconds", "The rate limit's window (no sample: no rate limit).",
                   lambda load: None if rate(load) is None else rate(load).per_seconds)
    yield by_queue("runledger_queue_rate_used", "Claims of the queue inside its current rate window, every key "
                   "counted (no sample: no rate limit).", lambda load: None if rate(load) is None else load.rate_used)


def registry_for(bind: Any, *, worker: Optional[WorkerMetrics] = None) -> Any:
    """Return a CollectorRegistry with the queue gauges of ``bind`` (and ``worker``'s counters, if given).

    Args:
        bind: the Engine to read the queue from, once per scrape.
        worker: the WorkerMetrics given to your Supervisor as its observer.

    Returns:
        A ``prometheus_client.CollectorRegistry`` of its own, so nothing else in
        the process's default registry is mixed in; mount it with
        ``prometheus_client.make_wsgi_app(registry)``.

    Raises:
        MissingExtra: prometheus_client is not installed.

    Example:
        ``make_wsgi_app(registry_for(engine, worker=metrics))``
    """
    registry = _prometheus().CollectorRegistry()
    registry.register(QueueCollector(bind))
    if worker is not None:
        registry.register(worker)
    return registry


def metrics_app(registry: Any, *, health: Optional[Callable[..., SupervisorHealth]] = None) -> Callable[..., Any]:
    """A WSGI app serving ``registry`` at ``/metrics`` and, given ``health``, the probes.

    ``/livez`` (and its alias ``/health``) answers from the loops alone, never
    asking the database: 200 while every loop runs and turns, else 503. A
    database outage is not a reason to restart a worker. ``/readyz`` adds the
    database, with a bounded check (:meth:`Supervisor.health`): 200 when ready,
    else 503. Bodies are the JSON of :meth:`SupervisorHealth.as_dict` and never
    name the database. ``health`` is called as ``health(check_database=...)``,
    as :meth:`Supervisor.health` is.
    """
    scrape = _prometheus().make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return scrape(environ, start_response)
        if health is not None and path in (*LIVENESS_PATHS, READINESS_PATH):
            ready = path == READINESS_PATH
            answer = health(check_database=ready)
            body = json.dumps(answer.as_dict(database=ready)).encode()
            status = "200 OK" if (answer.ready if ready else answer.live) else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                    ("Cache-Control", "no-store")])
            return [body]
        body = b"not found: try /metrics, /livez (or /health) or /readyz\n"
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not worth a log line."""


@dataclass
class MetricsServer:
    """An HTTP server for :func:`metrics_app` on a thread of its own."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve_metrics(
    registry: Any, port: int, *, host: str = DEFAULT_METRICS_HOST, health: Optional[Callable[..., SupervisorHealth]] = None,
) -> MetricsServer:
    """Serve :func:`metrics_app` on ``host:port`` (0: any free port) until :meth:`MetricsServer.close`.

    ``host`` is loopback by default: nothing on the port asks who is calling, so
    serving it to other hosts (``"0.0.0.0"`` for every interface) is a choice to
    make, behind a firewall or a network policy.
    """
    server = make_server(host, port, metrics_app(registry, health=health), _ThreadingServer, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="runledger-metrics", daemon=True)
    thread.start()
    log.info("metrics served", extra={"host": host, "port": server.server_address[1]})
    return MetricsServer(server, thread)
