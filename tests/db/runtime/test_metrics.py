"""Prometheus metrics after a real workload, read back with prometheus_client's own text parser."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.metrics import WorkerMetrics, registry_for
from runledger_sync.runtime.worker.loop import run_worker_loop
from tests.db.test_docs import marked
from tests.handlers import MAX_BLOCK_SECONDS, fast_config
from tests.support import claim_one, define, scalar, wait_until


def scrape(registry) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape, keyed by (sample name, sorted labels), parsed from the exposition text."""
    parsed = text_string_to_metric_families(generate_latest(registry).decode())
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in parsed for sample in family.samples}


def families(registry) -> dict[str, str]:
    # The 0.0.4 text format has no place for prometheus_client's *_created series:
    # the parser reads them as gauges of their own.
    return {family.name: family.type for family in text_string_to_metric_families(generate_latest(registry).decode())
            if not family.name.endswith("_created")}


#: The gauges by queue (label ``queue``).
QUEUE_FAMILIES = (
    "runledger_queue_ready_jobs", "runledger_queue_blocked_jobs", "runledger_queue_scheduled_jobs",
    "runledger_queue_leased_jobs", "runledger_queue_paused", "runledger_queue_global_limit",
    "runledger_queue_key_limit", "runledger_queue_rate_limit", "runledger_queue_rate_window_seconds",
    "runledger_queue_rate_used",
)


def _workload_registry() -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job("m.ok")
    def ok(ctx, payload):
        return None

    @registry.job("m.broken")
    def broken(ctx, payload):
        raise rl.JobFailure.terminal("m.broken", "cannot")

    @registry.job("m.later")
    def later(ctx, payload):
        return None

    return registry


def test_scrape_after_a_workload_has_every_family_and_the_counts_of_what_ran(engine):
    jobs = _workload_registry()
    jobs.sync_definitions(engine)
    for _ in range(3):
        rl.enqueue(engine, "m.ok", {})
    rl.enqueue(engine, "m.broken", {})
    for _ in range(2):
        rl.enqueue(engine, "m.later", {}, delay_seconds=3600)
    metrics = WorkerMetrics()
    shutdown = threading.Event()
    worker = threading.Thread(target=run_worker_loop, args=(engine, jobs, fast_config(), shutdown),
                              kwargs={"observer": metrics}, daemon=True)
    worker.start()
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE status IN ('SUCCEEDED', "
                                          "'DEAD_LETTERED')") == 4, timeout=30)
    finally:
        shutdown.set()
        worker.join(30)
    assert not worker.is_alive()

    registry = registry_for(engine, worker=metrics)
    samples = scrape(registry)

    assert families(registry) == {
        "runledger_queue_up": "gauge", "runledger_queue_scrape_duration_seconds": "gauge",
        "runledger_queue_jobs": "gauge", "runledger_queue_due_jobs": "gauge",
        "runledger_queue_oldest_due_age_seconds": "gauge", "runledger_queue_expired_leases": "gauge",
        "runledger_dead_letters_recent": "gauge", "runledger_schedules_late": "gauge",
        "runledger_schedules_max_lateness_seconds": "gauge",
        "runledger_jobs": "counter", "runledger_job_handler_duration_seconds": "histogram",
        "runledger_job_pickup_latency_seconds": "histogram", "runledger_claim_batch_jobs": "histogram",
        "runledger_group_write_jobs": "histogram", "runledger_group_write_duration_seconds": "histogram",
        "runledger_heartbeat_failures": "counter", "runledger_lease_losses": "counter",
        **dict.fromkeys(QUEUE_FAMILIES, "gauge"),
        "runledger_job_failures": "counter",
    }
    assert samples[("runledger_queue_up", ())] == 1
    assert samples[("runledger_jobs_total", (("job_type", "m.ok"), ("outcome", "succeeded")))] == 3
    assert samples[("runledger_jobs_total", (("job_type", "m.broken"), ("outcome", "dead_lettered")))] == 1
    assert samples[("runledger_job_failures_total", (("error_type", "runledger_sync.core.types.JobFailure"),
                                                     ("job_type", "m.broken")))] == 1
    assert samples[("runledger_job_handler_duration_seconds_count", (("job_type", "m.ok"),))] == 3
    assert samples[("runledger_job_pickup_latency_seconds_count", (("job_type", "m.ok"),))] == 3
    assert samples[("runledger_claim_batch_jobs_sum", ())] == 4
    assert samples[("runledger_group_write_jobs_sum", (("writer", "running"),))] == 4
    assert samples[("runledger_group_write_jobs_sum", (("writer", "outcome"),))] == 4
    assert samples[("runledger_queue_jobs", (("job_type", "m.later"), ("status", "PENDING")))] == 2
    assert samples[("runledger_queue_jobs", (("job_type", "m.ok"), ("status", "PENDING")))] == 0
    assert samples[("runledger_queue_due_jobs", (("job_type", "m.later"),))] == 0
    assert samples[("runledger_dead_letters_recent", (("job_type", "m.broken"),))] == 1
    assert samples[("runledger_dead_letters_recent", (("job_type", "m.ok"),))] == 0
    assert not [key for key in samples if key[0] in ("runledger_lease_losses_total", "runledger_heartbeat_failures_total")]


def test_a_lost_lease_counts_a_heartbeat_failure_and_a_lease_loss(engine):
    jobs = rl.JobRegistry()
    started = threading.Event()

    @jobs.job("m.slow")
    def slow(ctx, payload):
        started.set()
        ctx.wait_cancelled(MAX_BLOCK_SECONDS)

    jobs.sync_definitions(engine)
    job = rl.enqueue(engine, "m.slow", {})
    metrics = WorkerMetrics()
    shutdown = threading.Event()
    worker = threading.Thread(target=run_worker_loop, args=(engine, jobs, fast_config(), shutdown),
                              kwargs={"observer": metrics}, daemon=True)
    worker.start()
    try:
        assert started.wait(30)
        # Another worker took the job over: the next renewal misses its fence.
        with engine.begin() as conn:
            conn.execute(text("UPDATE job_queue SET worker_id = 'someone-else' WHERE id = :id"), {"id": job.id})
        lost = ("runledger_lease_losses_total", (("job_type", "m.slow"),))
        wait_until(lambda: scrape(metrics).get(lost) == 1, timeout=30)
    finally:
        shutdown.set()
        worker.join(30)

    samples = scrape(metrics)
    assert samples[("runledger_heartbeat_failures_total", (("job_type", "m.slow"),))] == 1
    assert samples[("runledger_jobs_total", (("job_type", "m.slow"), ("outcome", "lease_lost")))] == 1
    assert scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "LEASED"


def test_a_queue_that_cannot_be_read_reports_up_0_and_still_serves_the_worker_counters(engine):
    metrics = WorkerMetrics()
    metrics.job_finished("m.ok", "succeeded", 0.01)
    broken = rl.create_engine("postgresql://nobody@127.0.0.1:1/none")
    try:
        samples = scrape(registry_for(broken, worker=metrics))
    finally:
        broken.dispose()

    assert samples[("runledger_queue_up", ())] == 0
    assert samples[("runledger_jobs_total", (("job_type", "m.ok"), ("outcome", "succeeded")))] == 1
    assert not [key for key in samples if key[0] == "runledger_queue_jobs"]
    assert not [key for key in samples if key[0] in QUEUE_FAMILIES]


def test_the_queue_gauges_by_queue_say_what_waits_and_each_queues_pause_and_limits(engine):
    rl.configure_queue(engine, "mail", global_limit=4, key_limit=1, rate_limit=rl.RateLimit(100, per_seconds=60))
    rl.configure_queue(engine, "bulk", key_limit=None)
    rl.pause_queue(engine, "bulk")
    define(engine, "m.mail", queue="mail")
    define(engine, "m.bulk", queue="bulk")
    rl.enqueue(engine, "m.mail", {}, priority=1_000_000)
    claim_one(engine, job_type="m.mail")  # leased, and one claim inside mail's rate window
    rl.enqueue(engine, "m.mail", {}, concurrency_key="customer:1")
    rl.enqueue(engine, "m.mail", {}, concurrency_key="customer:1")  # held back by its key
    rl.enqueue(engine, "m.mail", {}, delay_seconds=3600)
    for _ in range(3):
        rl.enqueue(engine, "m.bulk", {})

    samples = scrape(registry_for(engine))

    def by_queue(name: str) -> dict[str, float]:
        return {dict(labels)["queue"]: value for (sample, labels), value in samples.items() if sample == name}

    assert samples[("runledger_queue_up", ())] == 1
    assert by_queue("runledger_queue_ready_jobs") == {"bulk": 3, "default": 0, "mail": 1}
    assert by_queue("runledger_queue_blocked_jobs") == {"bulk": 0, "default": 0, "mail": 1}
    assert by_queue("runledger_queue_scheduled_jobs") == {"bulk": 0, "default": 0, "mail": 1}
    assert by_queue("runledger_queue_leased_jobs") == {"bulk": 0, "default": 0, "mail": 1}
    assert by_queue("runledger_queue_paused") == {"bulk": 1, "default": 0, "mail": 0}
    # No sample where there is no limit.
    assert by_queue("runledger_queue_global_limit") == {"mail": 4}
    assert by_queue("runledger_queue_key_limit") == {"default": 1, "mail": 1}
    assert by_queue("runledger_queue_rate_limit") == {"mail": 100}
    assert by_queue("runledger_queue_rate_window_seconds") == {"mail": 60}
    assert by_queue("runledger_queue_rate_used") == {"mail": 1}
    # The gauges by job type keep their names and labels.
    assert samples[("runledger_queue_jobs", (("job_type", "m.bulk"), ("status", "PENDING")))] == 3


def test_the_grafana_dashboard_queries_only_metrics_a_worker_serves(engine):
    dashboard = json.loads((Path(__file__).parents[3] / "examples" / "grafana" / "runledger-sync.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    every_family = families(registry_for(engine, worker=WorkerMetrics()))
    served = {name + suffix for name, kind in every_family.items() for suffix in suffixes[kind]}

    used = {name for query in queries for name in re.findall(r"runledger_[a-z_]+", query)}

    assert len(queries) >= 12 and used
    assert used - served == set()
    assert {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in used} == set(every_family)


def test_the_documented_metrics_snippet_serves_the_workers_counters(engine):
    snippet = marked("metrics", "python")
    jobs = _workload_registry()
    jobs.sync_definitions(engine)
    job = rl.enqueue(engine, "m.ok", {})
    namespace = {"rl": rl, "engine": engine, "registry": jobs, "config": fast_config()}

    exec(compile(snippet, "docs:metrics", "exec"), namespace)  # noqa: S102 - our own documentation
    with namespace["supervisor"]:
        wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
        # The counter moves just after the success commits, on the job's own thread.
        ok = ("runledger_jobs_total", (("job_type", "m.ok"), ("outcome", "succeeded")))
        wait_until(lambda: ok in scrape(namespace["metrics"]))
    status: list[str] = []
    body = b"".join(namespace["metrics_app"]({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""},
                                             lambda line, headers: status.append(line)))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode()) for s in family.samples}

    assert status == ["200 OK"]
    assert samples[ok] == 1
    assert samples[("runledger_queue_jobs", (("job_type", "m.ok"), ("status", "PENDING")))] == 0
