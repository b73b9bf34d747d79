"""The worker writes the events its ``JobsConfig.event_log`` asks for; ``transitions`` is the default."""

from __future__ import annotations

from typing import Any

import runledger_sync as rl
from tests.support import JOB_TYPE, event_types, run_worker_until


def run_one_job(engine, handler_seconds: float = 0.0, **level: Any) -> list[str]:
    """Enqueue one job and run it with a worker, both at ``level`` (the defaults when empty); return its event rows."""
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE)
    def ok(context, payload):
        context.wait_cancelled(handler_seconds)  # long enough for a few renewals when asked

    registry.sync_definitions(engine)
    job = registry.enqueue(engine, JOB_TYPE, {}, **level)
    config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.2, **level)
    run_worker_until(engine, registry, config, lambda: rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 1)
    return event_types(engine, job.id)


def test_full_event_log_worker_writes_every_event_of_a_success(engine):
    assert run_one_job(engine, event_log="full") == ["ENQUEUED", "LEASED", "STAGE_CHANGED", "SUCCEEDED"]


def test_transitions_event_log_worker_claims_without_a_leased_event(engine):
    assert "LEASED" not in run_one_job(engine, event_log="transitions")


def test_transitions_event_log_worker_writes_only_the_outcome(engine):
    assert run_one_job(engine, event_log="transitions") == ["SUCCEEDED"]


def test_a_worker_at_the_defaults_writes_no_enqueued_leased_running_or_heartbeat_rows(engine):
    logged = run_one_job(engine, handler_seconds=0.7)

    assert logged == ["SUCCEEDED"]
    job = rl.list_jobs(engine)[0]
    # What the job page and `jobs show` list still opens with ENQUEUED, drawn from the job row.
    assert [event.event_type for event in rl.list_events(engine, job.id)] == ["ENQUEUED", "SUCCEEDED"]


def test_renewals_write_heartbeat_rows_only_at_the_full_level(engine):
    full = run_one_job(engine, handler_seconds=0.7, event_log="full")
    assert full.count("HEARTBEAT") >= 2
    assert full[:3] == ["ENQUEUED", "LEASED", "STAGE_CHANGED"] and full[-1] == "SUCCEEDED"
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE job_queue CASCADE")
    transitions = run_one_job(engine, handler_seconds=0.7, event_log="transitions")
    assert transitions == ["SUCCEEDED"]
