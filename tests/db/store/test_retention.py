"""rl.prune on a real PostgreSQL: exactly the old finished rows go, with what hangs on them; nothing live is touched."""

from __future__ import annotations

import threading
from datetime import timedelta
from uuid import UUID

import pytest
import sqlalchemy
from sqlalchemy import event, text

import runledger_sync as rl
from runledger_sync.store.maintenance.retention import PRUNE_LOCK_KEY
from tests.support import claim_one, define, scalar

DAY = timedelta(days=1)
FINISHED = ("SUCCEEDED", "CANCELED", "DEAD_LETTERED")


def finish(engine, job_id: UUID, status: str, days_ago: float) -> None:
    """Give a job a finished row as the worker leaves it: an attempt, two events, a dead letter if dead."""
    with engine.begin() as connection:
        connection.execute(text(
            "UPDATE job_queue SET status = :status, attempt = 1, "
            "finished_at = now() - make_interval(secs => :seconds) WHERE id = :id"),
            {"status": status, "seconds": days_ago * 86400, "id": job_id})
        connection.execute(text(
            "INSERT INTO job_attempts (id, job_id, attempt, finished_at) VALUES (gen_random_uuid(), :id, 1, now())"),
            {"id": job_id})
        connection.execute(text(
            "INSERT INTO job_events (job_id, run_number, attempt, event_type) "
            "VALUES (:id, 1, 1, 'LEASED'), (:id, 1, 1, 'STAGE_CHANGED')"), {"id": job_id})
        if status == "DEAD_LETTERED":
            connection.execute(text(
                "INSERT INTO job_dead_letters (job_id, job_type, run_number, attempt, payload_snapshot) "
                "VALUES (:id, 'test.job', 1, 1, '{}')"), {"id": job_id})


def finished_job(engine, status: str, days_ago: float) -> UUID:
    job_id = rl.enqueue(engine, "test.job", {}, event_log="full").id
    finish(engine, job_id, status, days_ago)
    return job_id


def existing(engine, ids) -> set[UUID]:
    with engine.connect() as connection:
        return set(connection.execute(text("SELECT id FROM job_queue WHERE id = ANY(:ids)"),
                                      {"ids": list(ids)}).scalars())


def count(engine, table: str) -> int:
    return scalar(engine, f"SELECT count(*) FROM {table}")  # table names are this file's constants


@pytest.fixture
def db(engine):
    define(engine)
    return engine


def test_prune_deletes_exactly_the_old_finished_jobs_with_their_attempts_events_and_dead_letters(db):
    old = {status: finished_job(db, status, days_ago=40) for status in FINISHED}
    young = {status: finished_job(db, status, days_ago=1) for status in FINISHED}
    pending = rl.enqueue(db, "test.job", {}).id
    leased = claim_one(db).id
    # Live rows are never pruned, however old they look.
    with db.begin() as connection:
        connection.execute(text("UPDATE job_queue SET created_at = now() - interval '90 days', "
                                "finished_at = now() - interval '90 days' WHERE id = ANY(:ids)"),
                           {"ids": [pending, leased]})
    before = {table: count(db, table) for table in ("job_attempts", "job_events", "job_dead_letters")}
    old_events = scalar(db, "SELECT count(*) FROM job_events WHERE job_id = ANY(:ids)", ids=list(old.values()))

    result = rl.prune(db)

    assert existing(db, [*old.values(), *young.values(), pending, leased]) == {*young.values(), pending, leased}
    assert result.jobs == {"SUCCEEDED": 1, "CANCELED": 1, "DEAD_LETTERED": 1} and result.total_jobs == 3
    assert (result.attempts, result.events, result.dead_letters) == (3, old_events, 1)
    assert old_events >= 3 * 3  # each: enqueued, leased, stage changed
    after = {table: count(db, table) for table in before}
    assert after == {"job_attempts": before["job_attempts"] - 3, "job_events": before["job_events"] - old_events,
                     "job_dead_letters": before["job_dead_letters"] - 1}
    assert result.complete and not result.contended and not result.dry_run


def test_each_status_keeps_its_own_age_and_none_keeps_it_forever(db):
    jobs = {status: finished_job(db, status, days_ago=10) for status in FINISHED}

    result = rl.prune(db, rl.Retention(succeeded=timedelta(days=9), canceled=timedelta(days=11),
                                       dead_lettered=None, workflow_runs=None))

    assert result.jobs == {"SUCCEEDED": 1}
    assert existing(db, jobs.values()) == {jobs["CANCELED"], jobs["DEAD_LETTERED"]}


def test_dry_run_counts_what_would_go_and_deletes_nothing(db):
    ids = [finished_job(db, "SUCCEEDED", days_ago=30) for _ in range(5)]

    dry = rl.prune(db, batch_size=2, dry_run=True)

    assert dry.dry_run and dry.jobs == {"SUCCEEDED": 5} and dry.batches == 3
    assert existing(db, ids) == set(ids)
    assert rl.prune(db, batch_size=2).jobs == dry.jobs
    assert existing(db, ids) == set()


def test_batches_are_bounded_each_its_own_transaction(db):
    ids = [finished_job(db, "SUCCEEDED", days_ago=30) for _ in range(7)]
    commits = []

    def on_commit(connection) -> None:
        commits.append(1)

    event.listen(db, "commit", on_commit)
    try:
        result = rl.prune(db, rl.Retention(canceled=None, dead_lettered=None, workflow_runs=None,
                                           dashboard_rollup=None, job_batches=None), batch_size=3)
    finally:
        event.remove(db, "commit", on_commit)

    assert result.batches == 3 and result.jobs == {"SUCCEEDED": 7}
    assert len(commits) == 3  # one short transaction per batch of at most three
    assert existing(db, ids) == set()


def test_max_batches_stops_early_and_the_next_prune_goes_on(db):
    for _ in range(5):
        finished_job(db, "CANCELED", days_ago=30)

    first = rl.prune(db, batch_size=2, max_batches=1)
    second = rl.prune(db, batch_size=2)

    assert (first.total_jobs, first.complete) == (2, False)
    assert (second.total_jobs, second.complete) == (3, True)


def workflow_with_jobs(engine, name: str) -> tuple[UUID, list[UUID]]:
    """A run of two job steps (the second after the first), both jobs released; returns (run id, job ids)."""
    wf = rl.Workflow(name)
    first = wf.job("first", "test.job")
    wf.job("second", "test.job", after=first)
    run = rl.enqueue_workflow(engine, wf)
    first_job = scalar(engine, "SELECT job_id FROM workflow_steps WHERE run_id = :run AND step_key = 'first'", run=run.id)
    return run.id, [first_job]


def test_a_finished_run_goes_with_its_steps_and_jobs_and_a_live_run_keeps_its_finished_jobs(db):
    done_run, done_jobs = workflow_with_jobs(db, "old.done")
    live_run, live_jobs = workflow_with_jobs(db, "old.live")
    for job_id in (*done_jobs, *live_jobs):
        finish(db, job_id, "SUCCEEDED", days_ago=60)
    with db.begin() as connection:
        connection.execute(text("UPDATE workflow_runs SET status = 'SUCCEEDED', "
                                "finished_at = now() - interval '40 days' WHERE id = :id"), {"id": done_run})

    result = rl.prune(db)

    assert result.workflow_runs == 1 and result.workflow_steps == 2
    assert result.jobs == {"SUCCEEDED": 1} and result.attempts == 1 and result.events >= 2
    assert scalar(db, "SELECT count(*) FROM workflow_runs WHERE id = :id", id=done_run) == 0
    assert scalar(db, "SELECT count(*) FROM workflow_steps WHERE run_id = :id", id=done_run) == 0
    assert existing(db, done_jobs) == set()
    # The live run, its steps and its finished job are all kept.
    assert scalar(db, "SELECT count(*) FROM workflow_steps WHERE run_id = :id AND job_id IS NOT NULL",
                  id=live_run) == 1
    assert existing(db, live_jobs) == set(live_jobs)


def test_a_finished_run_with_a_job_still_pending_is_kept(db):
    run_id, jobs = workflow_with_jobs(db, "odd.run")
    with db.begin() as connection:
        connection.execute(text("UPDATE workflow_runs SET status = 'CANCELED', "
                                "finished_at = now() - interval '40 days' WHERE id = :id"), {"id": run_id})

    assert rl.prune(db).workflow_runs == 0
    assert existing(db, jobs) == set(jobs)


def test_an_exclusive_prune_stops_while_another_holds_the_lock(db):
    ids = [finished_job(db, "SUCCEEDED", days_ago=30) for _ in range(3)]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.begin() as connection:
            connection.execute(sqlalchemy.select(sqlalchemy.func.pg_advisory_xact_lock(PRUNE_LOCK_KEY)))
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        blocked = rl.prune(db, exclusive=True)
    finally:
        release.set()
        holder.join(10)

    assert blocked.contended and not blocked.complete and blocked.total_jobs == 0
    assert existing(db, ids) == set(ids)
    assert rl.prune(db, exclusive=True).total_jobs == 3


def test_bad_arguments_are_refused_with_codes(db):
    with pytest.raises(rl.InvalidArgument, match="batch_size"):
        rl.prune(db, batch_size=0)
    with pytest.raises(rl.InvalidArgument, match="retention"):
        rl.prune(db, {"succeeded": DAY})
    with pytest.raises(rl.InvalidArgument, match="Retention.succeeded") as refused:
        rl.Retention(succeeded=timedelta(0))
    assert refused.value.code == "job.invalid_argument"


def test_retention_reads_from_text():
    assert rl.Retention.parse("off") is None
    parsed = rl.Retention.parse("succeeded=1d, dead_lettered=keep")
    assert parsed == rl.Retention(succeeded=DAY, dead_lettered=None)
    assert rl.Retention.parse(parsed.describe()) == parsed
    for bad in ("", "succeeded", "finished=1d", "succeeded=0d", "succeeded=soon"):
        with pytest.raises(rl.InvalidArgument):
            rl.Retention.parse(bad)
