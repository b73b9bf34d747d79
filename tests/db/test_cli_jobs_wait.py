"""``jobs wait ID``: the exit code says how the job ended, ``--json`` prints the row, a timeout exits 124."""

from __future__ import annotations

import json

import pytest

import runledger_sync as rl
from runledger_sync.cli.jobs import EXIT_CANCELED, EXIT_DEAD_LETTERED, EXIT_WAIT_TIMEOUT
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobFailure
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from tests.support import JOB_TYPE, claim_one, define

UNKNOWN_ID = "00000000-0000-7000-8000-000000000000"


@pytest.fixture
def job(engine) -> rl.JobRecord:
    define(engine, max_attempts=1)
    return rl.enqueue(engine, JOB_TYPE, {})


def test_a_succeeded_job_exits_0_and_prints_its_end(engine, run, job):
    complete_job_success(engine, **LeaseIdentity.of(claim_one(engine)).keywords())
    code, out, err = run("jobs", "wait", str(job.id))
    assert (code, err) == (0, "")
    assert out.startswith(f"job {job.id} SUCCEEDED (attempt 1, finished ")


def test_a_dead_lettered_job_exits_3_with_its_error(engine, run, job):
    complete_job_failure(engine, **LeaseIdentity.of(claim_one(engine)).keywords(),
                         failure=JobFailure.terminal("bad.input", "no such customer"), retry_delay_ms=None)
    code, out, _ = run("jobs", "wait", str(job.id))
    assert code == EXIT_DEAD_LETTERED == 3
    assert "DEAD_LETTERED" in out and "bad.input: no such customer" in out


def test_a_canceled_job_exits_4_and_json_prints_the_row(engine, run, job):
    rl.cancel_job(engine, job.id, reason="duplicate")
    code, out, _ = run("jobs", "wait", str(job.id), "--json")
    assert code == EXIT_CANCELED == 4
    row = json.loads(out)
    assert (row["id"], row["status"], row["status_reason"]) == (str(job.id), "CANCELED", "duplicate")


def test_a_job_not_ended_at_the_timeout_exits_124_with_the_code(run, job):
    code, out, err = run("jobs", "wait", str(job.id), "--timeout", "0")
    assert (code, out) == (EXIT_WAIT_TIMEOUT, "")
    assert EXIT_WAIT_TIMEOUT == 124
    assert err.startswith(f"error: job.wait_timeout: job {job.id} had not ended after 0 s; it is PENDING\n")
    assert "hint: the job is still queued or running" in err


def test_an_unknown_job_exits_1_and_a_bad_id_or_timeout_2(engine, run):
    code, _, err = run("jobs", "wait", UNKNOWN_ID, "--timeout", "1")
    assert code == 1 and err.startswith("error: job.not_found:")
    assert run("jobs", "wait", "not-a-uuid")[0] == 2
    assert run("jobs", "wait", UNKNOWN_ID, "--timeout", "-1")[0] == 2
