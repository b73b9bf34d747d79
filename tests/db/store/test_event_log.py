"""The event log level: ``full`` writes every event of the spec, ``transitions`` (the default) leaves
out ENQUEUED, LEASED, STAGE_CHANGED to running and HEARTBEAT, and nothing else."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.core import errors
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import EventLog, JobFailure
from runledger_sync.core.states import JobStage
from runledger_sync.core.records import JobSpec
from runledger_sync.store.admin.jobs import list_events
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many, enqueue_many_ids
from runledger_sync.store.workflows.enqueue import enqueue_workflow
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, update_job_progress
from tests.support import JOB_TYPE, define, event_types, events, rows, scalar

EVERY_STEP_OF_A_SUCCESS = ["ENQUEUED", "LEASED", "STAGE_CHANGED", "HEARTBEAT", "SUCCEEDED"]


def claimed(bind, event_log, *, prestart=True):
    enqueue(bind, JOB_TYPE, {}, event_log=event_log)
    claim = claim_prestart_jobs_for_types if prestart else claim_jobs
    [job] = claim(bind, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE], event_log=event_log)
    return job


def run_to_success(bind, event_log, *, grouped: bool, prestart: bool = True):
    """Claim, mark running, heartbeat and succeed one job at ``event_log``; return its id."""
    job = claimed(bind, event_log, prestart=prestart)
    lease = LeaseIdentity.of(job)
    if grouped:
        assert mark_jobs_running(bind, [lease], event_log=event_log) == [None]
    else:
        mark_job_running(bind, lease, event_log=event_log)
    heartbeat_job(bind, **lease.keywords(), lease_ttl_seconds=30, event_log=event_log)
    complete_job_success(bind, **lease.keywords())
    return job.id


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_full_event_log_writes_every_event_of_a_success(held, grouped):
    job_id = run_to_success(held, EventLog.FULL, grouped=grouped)

    assert event_types(held.engine, job_id) == EVERY_STEP_OF_A_SUCCESS
    logged = rows(held.engine, "SELECT event_type, stage, payload FROM job_events WHERE job_id = :id ORDER BY id", id=job_id)
    assert logged[1].payload == {"worker_id": "w", "lease_duration_seconds": 30}
    assert (logged[2].stage, logged[3].payload) == ("running", {"worker_id": "w"})


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
@pytest.mark.parametrize("prestart", [True, False], ids=["prestart", "direct"])
def test_transitions_event_log_leaves_out_leased_running_and_heartbeat_rows(held, grouped, prestart):
    job_id = run_to_success(held, "transitions", grouped=grouped, prestart=prestart)

    assert event_types(held.engine, job_id) == ["SUCCEEDED"]
    # The job row and its attempt keep what the left-out rows recorded.
    attempt = rows(held.engine, "SELECT worker_id, leased_at, execution_started_persisted_at FROM job_attempts "
                                "WHERE job_id = :id", id=job_id)[0]
    assert attempt.worker_id == "w" and attempt.leased_at is not None
    assert attempt.execution_started_persisted_at is not None


def test_default_is_the_transitions_event_log(held):
    enqueue(held, JOB_TYPE, {})
    [job] = claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=1,
                                                    job_types=[JOB_TYPE])
    lease = LeaseIdentity.of(job)
    mark_job_running(held, lease)
    heartbeat_job(held, **lease.keywords(), lease_ttl_seconds=30)
    complete_job_success(held, **lease.keywords())

    assert event_types(held.engine, job.id) == ["SUCCEEDED"]


def enqueue_every_way(bind, **level):
    """Enqueue one job, a batch, a batch by ids and a workflow's root at ``level``; return their job ids."""
    one = enqueue(bind, JOB_TYPE, {}, **level).id
    batch = [job.id for job in enqueue_many(bind, [JobSpec(JOB_TYPE, {})] * 2, **level)]
    ids = enqueue_many_ids(bind, [JobSpec(JOB_TYPE, {})] * 2, **level)
    flow = rl.Workflow("flow")
    flow.job("root", JOB_TYPE, {})
    root = enqueue_workflow(bind, flow, **level).step("root").job_id
    return [one, *batch, *ids, root]


@pytest.mark.parametrize("level", [{}, {"event_log": "transitions"}, {"event_log": EventLog.TRANSITIONS}],
                         ids=["default", "text", "enum"])
def test_enqueue_at_transitions_writes_no_enqueued_row(held, level):
    job_ids = enqueue_every_way(held, **level)

    assert scalar(held.engine, "SELECT count(*) FROM job_queue") == len(job_ids) == 6
    assert scalar(held.engine, "SELECT count(*) FROM job_events") == 0


def test_enqueue_at_full_writes_one_enqueued_row_per_job(held):
    job_ids = enqueue_every_way(held, event_log="full")

    logged = rows(held.engine, "SELECT job_id, run_number, event_type, stage, payload FROM job_events ORDER BY id")
    assert [row.job_id for row in logged] == job_ids
    assert {(row.run_number, row.event_type, row.stage) for row in logged} == {(1, "ENQUEUED", "queued")}
    assert {row.payload["job_type"] for row in logged} == {JOB_TYPE}


def test_list_events_draws_the_enqueued_entry_from_the_job_row_when_no_row_was_written(held):
    quiet = enqueue(held, JOB_TYPE, {}, event_log="transitions")
    logged = enqueue(held, JOB_TYPE, {}, event_log="full")

    [drawn] = list_events(held, quiet.id)
    [written] = list_events(held, logged.id)

    assert (drawn.job_id, drawn.run_number, drawn.attempt, drawn.event_type, drawn.stage, drawn.payload) == (
        quiet.id, 1, None, "ENQUEUED", None, {"job_type": JOB_TYPE})
    assert drawn.occurred_at == quiet.created_at
    assert (written.event_type, written.stage, written.payload) == ("ENQUEUED", "queued", {"job_type": JOB_TYPE})


def test_list_events_puts_the_drawn_enqueued_entry_first(held):
    job = claimed(held, EventLog.TRANSITIONS)
    complete_job_success(held, **LeaseIdentity.of(job).keywords())

    assert [event.event_type for event in list_events(held, job.id)] == ["ENQUEUED", "SUCCEEDED"]
    assert event_types(held.engine, job.id) == ["SUCCEEDED"]


def test_transitions_still_logs_progress_other_stages_failures_and_retries(held):
    job = claimed(held, EventLog.TRANSITIONS)
    lease = LeaseIdentity.of(job)
    update_job_progress(held, **lease.keywords(), stage=JobStage.RUNNING, progress_done=1, progress_total=4,
                                  event_log=EventLog.TRANSITIONS)
    update_job_progress(held, **lease.keywords(), stage=JobStage.SCHEDULED, event_log=EventLog.TRANSITIONS)
    complete_job_failure(held, **lease.keywords(), failure=JobFailure.retryable("x.flaky", "try again"),
                                   retry_delay_ms=0)

    logged = [(kind, payload.get("kind")) for kind, _, payload in events(held.engine, job.id)]
    assert logged == [("PROGRESS", None), ("STAGE_CHANGED", None),
                      ("FAILED", "RETRYABLE"), ("RETRY_SCHEDULED", "RETRYABLE")]
    stages = rows(held.engine, "SELECT stage FROM job_events WHERE job_id = :id AND event_type = 'STAGE_CHANGED'",
                  id=job.id)
    assert [row.stage for row in stages] == ["scheduled"]


@pytest.mark.parametrize(
    "call",
    [
        lambda bind, lease: claim_prestart_jobs_for_types(
            bind, worker_id="w", lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE], event_log="none"),
        lambda bind, lease: claim_jobs(bind, worker_id="w", lease_ttl_seconds=30, limit=1, event_log="FULL"),
        lambda bind, lease: mark_job_running(bind, lease, event_log=None),
        lambda bind, lease: mark_jobs_running(bind, [lease], event_log="quiet"),
        lambda bind, lease: mark_jobs_running(bind, [], event_log="quiet"),
        lambda bind, lease: heartbeat_job(bind, **lease.keywords(), lease_ttl_seconds=30, event_log=True),
        lambda bind, lease: enqueue(bind, JOB_TYPE, {}, event_log="none"),
        lambda bind, lease: enqueue_many(bind, [JobSpec(JOB_TYPE, {})], event_log="Full"),
        lambda bind, lease: enqueue_many_ids(bind, [JobSpec(JOB_TYPE, {})] * 3, event_log=None),
        lambda bind, lease: enqueue_workflow(bind, one_step_workflow(), event_log="quiet"),
    ],
    ids=["prestart claim", "direct claim", "running", "grouped running", "grouped running, no leases", "heartbeat",
         "enqueue", "enqueue_many", "enqueue_many_ids", "enqueue_workflow"],
)
def test_an_unknown_event_log_level_is_refused_before_any_write(held, call):
    job = claimed(held, EventLog.FULL)
    enqueue(held, JOB_TYPE, {})
    before = scalar(held.engine, "SELECT count(*) FROM job_events")

    with pytest.raises(errors.InvalidArgument) as refused:
        call(held, LeaseIdentity.of(job))

    assert refused.value.code == "job.invalid_argument"
    assert "event_log" in refused.value.message
    assert scalar(held.engine, "SELECT count(*) FROM job_events") == before
    assert scalar(held.engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'") == 1
    assert scalar(held.engine, "SELECT count(*) FROM job_queue") == 2
    assert scalar(held.engine, "SELECT count(*) FROM workflow_runs") == 0


def one_step_workflow():
    flow = rl.Workflow("flow")
    flow.job("root", JOB_TYPE, {})
    return flow


def test_both_levels_run_the_same_prepared_statements(engine):
    # The level is a bound flag, not a second statement text: one PREPARE serves both.
    define(engine)
    held = HeldConnection(engine)
    try:
        for level in (EventLog.FULL, EventLog.TRANSITIONS, EventLog.FULL):
            run_to_success(held, level, grouped=True)
        with held.connect() as connection:
            names = connection.exec_driver_sql("SELECT name FROM pg_prepared_statements ORDER BY name").scalars().all()
    finally:
        held.close()
    labels = [name.rsplit("_", 1)[0] for name in names]
    for label in ("runledger_enqueue", "runledger_claim_for_types", "runledger_mark_running", "runledger_heartbeat"):
        assert labels.count(label) == 1, names
