"""Organization-scoped reads and actions never see or touch another organization's jobs.

Two organizations, each with a PENDING, a SUCCEEDED and a DEAD_LETTERED job, plus
a global job (organization NULL). Every scoped call made for org-a is checked to
return only org-a's rows, and every scoped action aimed at an org-b (or global)
job is checked to answer job.not_found and leave every row as it was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from tests.db.test_bad_input_api import table_digest
from tests.support import define

JOB_TYPE = "scope.job"
ORGS = ("org-a", "org-b", None)


def finish(engine: Any, job: rl.JobRecord, *, fail: bool) -> None:
    claimed = claim_jobs(engine, worker_id="scope", lease_ttl_seconds=60, limit=1, job_types=[JOB_TYPE])
    assert [c.id for c in claimed] == [job.id]
    identity = LeaseIdentity.of(claimed[0]).keywords()
    if fail:
        complete_job_failure(engine, **identity, failure=rl.JobFailure.terminal("scope.failed", "x"),
                             retry_delay_ms=None)
    else:
        complete_job_success(engine, **identity)


@pytest.fixture
def jobs(engine) -> dict[tuple[Any, str], Any]:
    define(engine, JOB_TYPE, max_attempts=1)
    made = {}
    for org in ORGS:
        for state in ("succeeded", "dead", "pending"):
            job = rl.enqueue(engine, JOB_TYPE, {"org": org, "state": state}, organization_id=org,
                             priority=1_000_000 if state != "pending" else 0)
            if state != "pending":
                finish(engine, job, fail=state == "dead")
            made[(org, state)] = job.id
    return made


def ids_of(engine, records) -> set:
    return {record.job_id if hasattr(record, "job_id") else record.id for record in records}


def mine(jobs, org: Any) -> set:
    return {job_id for (owner, _), job_id in jobs.items() if owner == org}


@pytest.mark.parametrize("org", ["org-a", "org-b"])
def test_scoped_reads_see_only_their_organization(engine, jobs, org):
    assert ids_of(engine, rl.list_jobs(engine, organization_id=org)) == mine(jobs, org)
    assert rl.count_jobs(engine, organization_id=org) == 3
    assert rl.count_jobs(engine, organization_id=org, status="PENDING") == 1
    assert ids_of(engine, rl.list_dead_letters(engine, organization_id=org)) == {jobs[(org, "dead")]}
    stats = rl.queue_stats(engine, organization_id=org)
    assert sum(stats.by_status.values()) == 3
    assert stats.by_status["PENDING"] == stats.by_status["SUCCEEDED"] == stats.by_status["DEAD_LETTERED"] == 1
    for (owner, _), job_id in jobs.items():
        found = rl.get_job(engine, job_id, organization_id=org)
        assert (found is not None) == (owner == org)


def test_an_unscoped_read_is_the_admin_view_of_everything(engine, jobs):
    assert ids_of(engine, rl.list_jobs(engine)) == set(jobs.values())


@pytest.mark.parametrize(
    ("action", "target"),
    [
        ("cancel", ("org-b", "pending")),
        ("cancel", (None, "pending")),
        ("requeue", ("org-b", "dead")),
        ("requeue", ("org-b", "succeeded")),
        ("requeue", (None, "dead")),
    ],
)
def test_scoped_actions_on_another_organizations_job_are_not_found_and_change_nothing(engine, jobs, action, target):
    act = rl.cancel_job if action == "cancel" else rl.requeue_job
    before = table_digest(engine)

    with pytest.raises(rl.JobNotFound) as caught:
        act(engine, jobs[target], organization_id="org-a")

    assert caught.value.code == "job.not_found"
    # Not "invalid state": the caller must not learn the job exists elsewhere.
    assert "org-b" not in caught.value.message
    assert table_digest(engine) == before


def test_scoped_actions_on_the_callers_own_jobs_work_and_leave_the_others_alone(engine, jobs):
    others = {job.id: job for job in rl.list_jobs(engine) if job.organization_id != "org-a"}

    assert rl.cancel_job(engine, jobs[("org-a", "pending")], organization_id="org-a").status is rl.JobStatus.CANCELED
    assert rl.requeue_job(engine, jobs[("org-a", "dead")], organization_id="org-a").status is rl.JobStatus.PENDING

    assert {job.id: job for job in rl.list_jobs(engine) if job.organization_id != "org-a"} == others


def test_an_organization_id_that_differs_only_in_case_or_spacing_is_another_organization(engine, jobs):
    for lookalike in ("ORG-A", "org-a ", " org-a", "org-a\t", "org\u2010a"):
        assert rl.list_jobs(engine, organization_id=lookalike) == []
        assert rl.get_job(engine, jobs[("org-a", "pending")], organization_id=lookalike) is None


def test_dead_letter_replay_for_one_organization_requeues_only_its_jobs(engine, jobs, fresh_database, capsys):
    before = {job.id: job for job in rl.list_jobs(engine) if job.organization_id != "org-a"}

    assert cli.main(["--database-url", fresh_database, "dead-letters", "replay", "--org", "org-a"]) == 0

    assert capsys.readouterr().out.strip() == "requeued 1 dead-lettered job(s)"
    assert rl.get_job(engine, jobs[("org-a", "dead")]).status is rl.JobStatus.PENDING
    after = {job.id: job for job in rl.list_jobs(engine) if job.organization_id != "org-a"}
    assert after == before


def test_cli_scoped_listing_and_stats_see_only_their_organization(engine, jobs, fresh_database, capsys):
    assert cli.main(["--database-url", fresh_database, "jobs", "list", "--org", "org-b", "--json"]) == 0
    listed = {json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()}
    assert listed == {str(job_id) for job_id in mine(jobs, "org-b")}
    assert cli.main(["--database-url", fresh_database, "stats", "--org", "org-b", "--json"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["by_status"].values()) == 3
