"""The worker writes the events its ``JobsConfig.event_log`` asks for."""

from __future__ import annotations

import runledger_sync as rl
from tests.support import JOB_TYPE, event_types, run_worker_until


def run_one_job(engine, event_log: str, handler_seconds: float = 0.0) -> list[str]:
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def ok(context, payload):
        context.wait_cancelled(handler_seconds)  # long enough for a few renewals when asked

    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, {})
    config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.2,
                           event_log=event_log)
    run_worker_until(engine, registry, config, lambda: rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 1)
    return event_types(engine, job.id)


def test_full_event_log_worker_writes_every_event_of_a_success(engine):
    assert run_one_job(engine, "full") == ["ENQUEUED", "LEASED", "STAGE_CHANGED", "SUCCEEDED"]


def test_transitions_event_log_worker_claims_without_a_leased_event(engine):
    assert "LEASED" not in run_one_job(engine, "transitions")


def test_transitions_event_log_worker_writes_only_enqueued_and_succeeded(engine):
    assert run_one_job(engine, "transitions") == ["ENQUEUED", "SUCCEEDED"]


def test_renewals_write_heartbeat_rows_only_at_the_full_level(engine):
    full = run_one_job(engine, "full", handler_seconds=0.7)
    assert full.count("HEARTBEAT") >= 2
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE job_queue CASCADE")
    transitions = run_one_job(engine, "transitions", handler_seconds=0.7)
    assert transitions == ["ENQUEUED", "SUCCEEDED"]
