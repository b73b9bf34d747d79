"""Group writes (mark running, success for many leases in one transaction) keep every row's fence."""

from __future__ import annotations

import dataclasses

import json
import threading
import time

import pytest
from sqlalchemy import event, text

from runledger_sync.core import errors
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.types import JobCompletion
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.attempt.ends import release_unstarted_job_claim
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.attempt.outcomes import apply_transitions
from runledger_sync.store.attempt.running import update_job_progress
from tests.support import JOB_TYPE, attempts, define, event_types, expire_lease, rows, write_successes


def claim(engine, count, worker_id="worker-a", lease_ttl_seconds=30, **level):
    define(engine, max_attempts=3)
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(count)], **level)
    jobs = claim_prestart_jobs_for_types(
        engine, worker_id=worker_id, lease_ttl_seconds=lease_ttl_seconds, limit=count, job_types=[JOB_TYPE], **level)
    assert len(jobs) == count
    return jobs


def identities(jobs):
    return [LeaseIdentity.of(job) for job in jobs]


def test_mark_jobs_running_matches_the_single_write_for_every_job(engine):
    jobs = claim(engine, 3, event_log="full")
    assert mark_jobs_running(engine, identities(jobs), event_log="full") == [None] * 3
    assert rows(engine, "SELECT DISTINCT status, stage FROM job_queue") == [("LEASED", "running")]
    for job in jobs:
        assert event_types(engine, job.id) == ["ENQUEUED", "LEASED", "STAGE_CHANGED"]
        assert attempts(engine, job.id)[0].execution_started_persisted_at is not None
    # Once running is persisted, the claim can no longer be handed back unstarted.
    with pytest.raises(errors.UnstartedClaimReleaseNotApplicable):
        release_unstarted_job_claim(
            engine, **LeaseIdentity.of(jobs[0]).keywords(), reason="test", delay_ms=0)


def test_a_refused_lease_does_not_stop_the_others(engine):
    jobs = claim(engine, 3)
    expire_lease(engine, jobs[1].id)
    wrong_worker = LeaseIdentity(jobs[2].id, jobs[2].run_number, jobs[2].attempt, "someone-else")
    results = mark_jobs_running(engine, [identities(jobs)[0], identities(jobs)[1], wrong_worker])
    assert results[0] is None
    assert isinstance(results[1], errors.LeaseOwnerMismatch) and results[1].code == "job.lease_owner_mismatch"
    assert isinstance(results[2], errors.LeaseOwnerMismatch)
    stages = dict(rows(engine, "SELECT id, stage FROM job_queue"))
    assert stages == {jobs[0].id: "running", jobs[1].id: "queued", jobs[2].id: "queued"}
    assert "STAGE_CHANGED" not in event_types(engine, jobs[1].id)


def test_a_group_success_writes_each_completion_with_its_attempt_and_event(engine):
    jobs = claim(engine, 3)
    mark_jobs_running(engine, identities(jobs))
    completions = [
        JobCompletion.success().with_output({"n": 0}),
        None,
        JobCompletion(progress_done=2, progress_total=2, checkpoint={"page": 9}),
    ]
    assert write_successes(engine, list(zip(identities(jobs), completions, strict=True))) == [None] * 3
    stored = {r.id: r for r in rows(engine, "SELECT * FROM job_queue")}
    assert {row.status for row in stored.values()} == {"SUCCEEDED"}
    assert {row.stage for row in stored.values()} == {"completed"}
    assert stored[jobs[0].id].output == {"n": 0} and stored[jobs[1].id].output is None
    assert (stored[jobs[2].id].progress_done, stored[jobs[2].id].checkpoint) == (2, {"page": 9})
    assert all(row.worker_id is None and row.lease_expires_at is None for row in stored.values())
    for job in jobs:
        assert event_types(engine, job.id)[-1] == "SUCCEEDED"
        assert attempts(engine, job.id)[0].finished_at is not None
    # A second success for the same leases is refused row by row, never written twice.
    again = write_successes(engine, [(i, None) for i in identities(jobs)])
    assert all(isinstance(r, errors.LeaseOwnerMismatch) for r in again)
    assert rows(engine, "SELECT count(*) FROM job_events WHERE event_type = 'SUCCEEDED'")[0][0] == 3


def test_invalid_merged_progress_writes_nothing_for_the_whole_group(engine):
    jobs = claim(engine, 2)
    update_job_progress(engine, **LeaseIdentity.of(jobs[1]).keywords(), progress_total=5)
    with pytest.raises(errors.InvalidCompletionProgress):
        write_successes(engine, [(identities(jobs)[0], None), (identities(jobs)[1], JobCompletion(progress_done=9))])
    assert rows(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'")[0][0] == 0


def test_completion_that_is_not_json_is_refused_before_any_write(engine):
    jobs = claim(engine, 1)
    with pytest.raises(errors.InvalidPayload):
        write_successes(engine, [(identities(jobs)[0], JobCompletion.success().with_output({"x": {1, 2}}))])
    assert rows(engine, "SELECT status FROM job_queue")[0][0] == "LEASED"


def test_outcomes_whose_leases_run_out_while_the_group_waits_on_its_row_lock_still_land(engine):
    """An outcome needs the lease held, not live: nobody else took the jobs while the group waited."""
    jobs = claim(engine, 2, lease_ttl_seconds=1)
    blocker = engine.connect()
    transaction = blocker.begin()
    blocker.execute(text("SELECT 1 FROM job_queue WHERE id = :id FOR UPDATE"), {"id": jobs[0].id})
    results = []
    writer = threading.Thread(target=lambda: results.extend(write_successes(engine, [(i, None) for i in identities(jobs)])))
    writer.start()
    time.sleep(1.5)  # both leases (1 s) expire while the writer waits on the first row's lock
    transaction.rollback()
    blocker.close()
    writer.join(10)
    assert results == [None, None]
    assert rows(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'")[0][0] == 2


def test_a_lease_renewed_while_the_group_waits_is_judged_on_its_renewed_row(engine):
    """The row changed under the wait: the fence reads the committed new version, not the one first seen."""
    jobs = claim(engine, 2, lease_ttl_seconds=1)
    renewer = engine.connect()
    transaction = renewer.begin()
    renewer.execute(text("UPDATE job_queue SET lease_expires_at = now() + interval '30 seconds' WHERE id = :id"),
                    {"id": jobs[0].id})
    results = []
    writer = threading.Thread(target=lambda: results.extend(mark_jobs_running(engine, identities(jobs))))
    writer.start()
    time.sleep(1.5)  # the second lease (1 s) runs out; the first is renewed once the renewal commits
    transaction.commit()
    renewer.close()
    writer.join(10)
    assert len(results) == 2
    assert not isinstance(results[0], errors.RunledgerError) and isinstance(results[1], errors.LeaseOwnerMismatch)
    assert rows(engine, "SELECT stage FROM job_queue WHERE id = :id", id=jobs[0].id)[0][0] == "running"
    assert rows(engine, "SELECT stage FROM job_queue WHERE id = :id", id=jobs[1].id)[0][0] == "queued"


def test_empty_groups_write_nothing(engine):
    assert mark_jobs_running(engine, []) == [] and write_successes(engine, []) == []


@pytest.fixture
def group_plans(engine):
    """EXPLAIN's answer for each statement of every group write run on ``engine``, asked on its own connection."""
    plans = []

    def explain(_conn, cursor, statement, parameters, _context, _executemany):
        prelude, *statements = statement.split("; ")
        if statements and statements[0].startswith("EXECUTE runledger_lock_leases"):
            for one in statements:
                # With the prelude in the same query: the write's transaction may be that query alone.
                cursor.execute(f"{prelude}; EXPLAIN (FORMAT JSON) {one}", parameters)
                explained = cursor.fetchone()[0]
                plans.append((one.split("(")[0], json.loads(explained) if isinstance(explained, str) else explained))

    event.listen(engine, "before_cursor_execute", explain)
    yield plans
    event.remove(engine, "before_cursor_execute", explain)


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.parametrize("rows", [1, 8])
def test_group_writes_planned_once_on_a_nearly_empty_table_still_find_rows_by_id_once_it_is_long(
    engine, held, group_plans, rows,
):
    # The plans are made on an analyzed table of a row or a few, where reading it
    # whole would be cheapest, and kept while the queue grows.
    first = claim(engine, rows)
    with engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE")
    mark_jobs_running(held, identities(first))
    write_successes(held, [(identity, None) for identity in identities(first)])
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(5_000)])
    later = claim_prestart_jobs_for_types(engine, worker_id="worker-a", lease_ttl_seconds=30, limit=4,
                                                    job_types=[JOB_TYPE])
    group_plans.clear()
    assert mark_jobs_running(held, identities(later)) == [None] * 4
    assert write_successes(held, [(i, None) for i in identities(later)]) == [None] * 4
    with held.connect() as connection:
        kinds = connection.execute(text(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE name ~ "
            "'^runledger_(lock_leases|mark_running|apply_transitions_plain)_'")).all()
        connection.rollback()
    # PostgreSQL's own choice plans each of the first five calls afresh; these were planned once.
    assert len(kinds) == 3 and all(generic > 0 and custom == 0 for _, generic, custom in kinds), kinds
    assert len(group_plans) == 4  # lock and write, twice
    for label, plan in group_plans:
        scans = [n for n in plan_nodes(plan[0]["Plan"]) if "Scan" in n["Node Type"] and "Relation Name" in n]
        assert scans, label
        for scan in scans:
            assert scan["Node Type"] != "Seq Scan", (label, scan["Relation Name"])
            key = "id" if scan["Relation Name"] == "job_queue" else "job_id"
            assert f"({key} = " in scan.get("Index Cond", ""), (label, scan["Relation Name"], scan.get("Index Cond"))


def _failure(code="test.failed", kind="retryable"):
    from runledger_sync.core.types import JobFailure
    return getattr(JobFailure, kind)(code, f"{code} happened")


def test_a_group_failure_writes_each_transition_as_decided_never_deciding_again(engine):
    from runledger_sync.core.outcomes import DeadLetter, Retry
    from runledger_sync.core.types import JobDeadLetterInfo, JobDeadLetterReason

    jobs = claim(engine, 3)  # attempt 1 of 3 each
    retryable = _failure("test.retry")
    # A retryable failure on its first attempt, which the row's own rule would retry:
    # the worker decided to dead-letter it, and that is what is written.
    dead = DeadLetter(retryable, JobDeadLetterInfo(failure=retryable, reason=JobDeadLetterReason.ATTEMPTS_EXHAUSTED,
                                                   max_attempts=3))
    terminal = _failure("test.terminal", "terminal")
    # A terminal failure the row's rule would dead-letter, decided as a retry.
    results = apply_transitions(engine, [
        (identities(jobs)[0], Retry(retryable, 60_000)),
        (identities(jobs)[1], dead),
        (identities(jobs)[2], Retry(terminal, 0)),
    ])
    assert results == [None] * 3
    state = {row.id: row for row in rows(engine, "SELECT id, status, last_error_code, next_run_at - now() AS wait "
                                                 "FROM job_queue")}
    assert (state[jobs[0].id].status, state[jobs[0].id].last_error_code) == ("PENDING", "test.retry")
    assert 59 <= state[jobs[0].id].wait.total_seconds() <= 60
    assert state[jobs[1].id].status == "DEAD_LETTERED"
    assert state[jobs[2].id].status == "PENDING"
    assert rows(engine, "SELECT job_id FROM job_dead_letters") == [(jobs[1].id,)]
    assert event_types(engine, jobs[0].id)[-2:] == ["FAILED", "RETRY_SCHEDULED"]
    assert event_types(engine, jobs[1].id)[-2:] == ["FAILED", "DEAD_LETTERED"]
    assert [(a.outcome, a.error_code, a.retry_delay_ms) for a in attempts(engine, jobs[0].id)] == [
        ("RETRYABLE", "test.retry", 60_000)]
    assert [(a.outcome, a.retry_delay_ms) for a in attempts(engine, jobs[1].id)] == [("RETRYABLE", None)]


def test_a_group_failure_writes_the_group_in_one_statement_and_keeps_each_fence(engine):
    from runledger_sync.core.outcomes import Retry

    jobs = claim(engine, 4)
    leases = identities(jobs)
    leases[3] = dataclasses.replace(leases[3], worker_id="intruder")
    statements = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    results = apply_transitions(engine, [(identity, Retry(_failure(), 0)) for identity in leases])
    assert results[:3] == [None] * 3 and isinstance(results[3], errors.LeaseOwnerMismatch)
    writes = [s for s in statements if "EXECUTE runledger_apply_transitions" in s]
    # The plain jobs' one query; then the refused lease's own pass, which writes nothing.
    assert len(writes) == 2
    assert rows(engine, "SELECT status, count(*) FROM job_queue GROUP BY 1 ORDER BY 1") == [
        ("LEASED", 1), ("PENDING", 3)]
    assert "FAILED" not in event_types(engine, jobs[3].id)
