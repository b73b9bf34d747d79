"""``apply_transitions``: every kind of decided outcome in one call, one fenced statement per group.

The first test writes a mixed group and compares every row it wrote, column
for column (ids and timestamps aside), with ``outcome_rows.json``: the rows the
three per-kind group writes it replaced (success, continuation, failure) wrote
for the same group, recorded from them before they were removed. A change to
what an outcome writes shows there, row by row.
"""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

import runledger_sync as rl
from runledger_sync.core import errors
from runledger_sync.core.evidence import FailureEvidence
from runledger_sync.core.exception_rules import Verdict
from runledger_sync.core.outcomes import Canceled, Continue, DeadLetter, LeaseLost, Retry, Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.types import JobCompletion, JobDeadLetterInfo, JobDeadLetterReason, JobFailure
from runledger_sync.errors import CheckpointTooLarge, OutputTooLarge
from runledger_sync.store.claim.claim import claim_prestart_jobs_for_types
from runledger_sync.store.attempt.running import mark_jobs_running
from runledger_sync.store.attempt.outcomes import apply_transitions
from runledger_sync.store.attempt.running import update_job_progress
from tests.support import define, event_types, rows

NEW = "new"


def _dead(failure: JobFailure, reason: JobDeadLetterReason, **kwargs: Any) -> DeadLetter:
    return DeadLetter(failure, JobDeadLetterInfo(failure=failure, reason=reason, max_attempts=3), **kwargs)


def _transitions() -> dict[str, Any]:
    """One transition per plain job (by its payload's ``n``), covering what each kind can carry."""
    retryable = JobFailure.retryable("cmp.retry", "try again", retry_after=datetime.timedelta(seconds=90))
    terminal = JobFailure.terminal("cmp.terminal", "no way")
    evidence = FailureEvidence("builtins.ValueError", "Traceback ...\nValueError: no way")
    return {
        "succeed-none": Succeed(None),  # type: ignore[arg-type]
        "succeed-full": Succeed(JobCompletion(progress_done=3, progress_total=4, checkpoint={"page": 3},
                                              output={"rows": [1, 2]})),
        "succeed-progress-kept": Succeed(JobCompletion(output="plain text")),
        "continue-snooze": Continue(60_000),
        "continue-checkpoint": Continue(120_000, {"cursor": "abc"}, 5, 10),
        "retry": Retry(retryable, 90_000, evidence),
        "retry-no-evidence": Retry(JobFailure.retryable("cmp.flaky", "flaky"), 45_000),
        "dead-exhausted": _dead(retryable, JobDeadLetterReason.ATTEMPTS_EXHAUSTED, evidence=evidence),
        "dead-stopped": _dead(terminal, JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE,
                              stopped_by=Verdict.DEAD_LETTER_ON),
    }


def _workflow(prefix: str) -> rl.Workflow:
    """Four runs' worth of steps in one: a success releases, a dead letter cancels, a continuation leaves it running."""
    wf = rl.Workflow(f"{prefix}.cmp")
    ok = wf.job("ok", f"{prefix}.wf", {"step": "ok"})
    wf.job("after-ok", f"{prefix}.later", {"step": "after-ok"}, after=[ok], release="on_success")
    bad = wf.job("bad", f"{prefix}.wf", {"step": "bad"})
    wf.job("after-bad", f"{prefix}.later", {"step": "after-bad"}, after=[bad], release="on_success")
    wf.job("again", f"{prefix}.wf", {"step": "again"}, continuation=True)
    retried = wf.job("retried", f"{prefix}.wf", {"step": "retried"})
    wf.job("after-retried", f"{prefix}.later", {"step": "after-retried"}, after=[retried])
    return wf


_WORKFLOW_TRANSITIONS = {
    "ok": Succeed(JobCompletion(output={"done": True})),
    "bad": _dead(JobFailure.terminal("cmp.wf_bad", "bad step"), JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE),
    "again": Continue(30_000, {"round": 2}),
    "retried": Retry(JobFailure.retryable("cmp.wf_retry", "later"), 30_000),
}


def _lease_set(engine: Any, prefix: str) -> tuple[list[tuple[str, LeaseIdentity, Any]], UUID]:
    """Enqueue and claim one set of jobs (types prefixed ``prefix``); return (name, lease, transition) and the run.

    At the full event log: the rows were recorded with every event written.
    """
    for job_type in (f"{prefix}.plain", f"{prefix}.wf", f"{prefix}.later"):
        define(engine, job_type, max_attempts=3)
    plain = _transitions()
    for name in plain:
        rl.enqueue(engine, f"{prefix}.plain", {"name": name}, event_log="full")
    # Stored progress and checkpoint that a transition keeps or replaces.
    rl.enqueue(engine, f"{prefix}.plain", {"name": "stranger"}, event_log="full")
    run = rl.enqueue_workflow(engine, _workflow(prefix), event_log="full")
    claimed = claim_prestart_jobs_for_types(engine, worker_id="worker-cmp", lease_ttl_seconds=30, limit=100,
                                            job_types=[f"{prefix}.plain", f"{prefix}.wf"], event_log="full")
    assert mark_jobs_running(engine, [LeaseIdentity.of(job) for job in claimed], event_log="full") == [None] * len(claimed)
    items = []
    for job in claimed:
        name = job.payload.get("name") or job.payload["step"]
        lease = LeaseIdentity.of(job)
        update_job_progress(engine, **lease.keywords(), progress_done=1, progress_total=8, checkpoint={"saved": 1})
        if name == "stranger":
            # A lease this worker does not hold: its fence refuses it, whatever the kind.
            items.append((name, LeaseIdentity(job.id, job.run_number, job.attempt, "someone-else"),
                          Succeed(JobCompletion())))
        else:
            items.append((name, lease, plain.get(name) or _WORKFLOW_TRANSITIONS[name]))
    return sorted(items, key=lambda item: item[0]), run.id


def _write_new(engine: Any, items: list[tuple[str, LeaseIdentity, Any]]) -> dict[str, Any]:
    # The kinds interleaved (the items come sorted by name, so by kind), as the completer's queue holds them.
    mixed = items[1::2] + items[::2]
    results = apply_transitions(engine, [(lease, transition) for _, lease, transition in mixed])
    return {name: result for (name, _, _), result in zip(mixed, results, strict=True)}


def _plain(value: Any, prefix: str) -> Any:
    """``value`` with what differs between two identical writes (ids, clocks, the set's prefix) blanked."""
    if isinstance(value, datetime.datetime):
        return "<time>"
    if isinstance(value, UUID):
        return "<id>"
    if isinstance(value, str):
        return value.replace(f"{prefix}.", "<set>.")
    if isinstance(value, dict):
        # A row's own serial id, and the time a retry or continuation is due, differ between two writes.
        return {key: "<blank>" if key in ("id", "next_run_at") else _plain(item, prefix) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, prefix) for item in value]
    if isinstance(value, Decimal):
        return float(value)
    return value


def _table(engine: Any, sql: str, prefix: str, **params: Any) -> list[dict[str, Any]]:
    return [_plain(dict(row._mapping), prefix) for row in rows(engine, sql, **params)]


def _written(engine: Any, items: list[tuple[str, LeaseIdentity, Any]], run_id: UUID, prefix: str) -> dict[str, Any]:
    """Every row the write touched, per job name, with the run's steps and the jobs they released."""
    found: dict[str, Any] = {}
    for name, lease, _ in items:
        job_id = lease.job_id
        found[name] = {
            "job": _table(engine, "SELECT * FROM job_queue WHERE id = :id", prefix, id=job_id),
            "attempts": _table(engine, "SELECT * FROM job_attempts WHERE job_id = :id "
                                       "ORDER BY run_number, attempt", prefix, id=job_id),
            "events": _table(engine, "SELECT * FROM job_events WHERE job_id = :id ORDER BY id", prefix, id=job_id),
            "dead_letters": _table(engine, "SELECT * FROM job_dead_letters WHERE job_id = :id", prefix, id=job_id),
        }
    found["workflow"] = {
        "run": _table(engine, "SELECT * FROM workflow_runs WHERE id = :id", prefix, id=run_id),
        "steps": _table(engine, "SELECT * FROM workflow_steps WHERE run_id = :id ORDER BY step_key", prefix, id=run_id),
        "released": _table(engine, "SELECT q.job_type, q.status, q.payload, s.step_key FROM job_queue q "
                                   "JOIN workflow_steps s ON s.id = q.workflow_step_id "
                                   "WHERE s.run_id = :id AND q.job_type LIKE '%.later' ORDER BY s.step_key", prefix,
                           id=run_id),
    }
    return found


def _answer(result: Any) -> Any:
    return None if result is None else (type(result).__name__, result.code)


def test_apply_transitions_writes_every_row_as_the_per_kind_group_writes_did(engine):
    items, run = _lease_set(engine, NEW)

    answers = _write_new(engine, items)

    recorded = json.loads((Path(__file__).parent / "outcome_rows.json").read_text())
    assert {name: _answer(result) for name, result in answers.items()} == {
        name: None if answer is None else tuple(answer) for name, answer in recorded["answers"].items()}
    written = json.loads(json.dumps(_written(engine, items, run, NEW), default=str))
    assert written.keys() == recorded["rows"].keys()
    for name in recorded["rows"]:
        assert written[name] == recorded["rows"][name], name
    # Not vacuous: every kind landed, and the workflow pass ran.
    statuses = {name: found["job"][0]["status"] for name, found in written.items() if name != "workflow"}
    assert {"SUCCEEDED", "PENDING", "DEAD_LETTERED", "LEASED"} == set(statuses.values())
    steps = {step["step_key"]: step["status"] for step in written["workflow"]["steps"]}
    assert (steps["ok"], steps["after-ok"], steps["bad"], steps["again"]) == ("SUCCEEDED", "ENQUEUED", "FAILED",
                                                                              "RUNNING")


def test_apply_transitions_writes_a_mixed_group_in_one_statement_for_plain_jobs(engine):
    from sqlalchemy import event

    items, _ = _lease_set(engine, NEW)
    plain = [(lease, transition) for name, lease, transition in items if name in _transitions()]
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    assert apply_transitions(engine, plain) == [None] * len(plain)
    assert len([s for s in statements if "EXECUTE runledger_apply_transitions" in s]) == 1


def _one_leased(engine: Any) -> tuple[UUID, LeaseIdentity]:
    define(engine, "one.job", max_attempts=3)
    job = rl.enqueue(engine, "one.job", {})
    [claimed] = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=1,
                                              job_types=["one.job"])
    lease = LeaseIdentity.of(claimed)
    update_job_progress(engine, **lease.keywords(), progress_done=5, progress_total=5, checkpoint={"saved": 1})
    return job.id, lease


@pytest.mark.parametrize("transition", [Succeed(JobCompletion(progress_total=3)),
                                        Continue(0, None, None, 2)], ids=["success", "continuation"])
def test_progress_invalid_once_merged_refuses_the_group_with_its_code_and_writes_nothing(engine, transition):
    job_id, lease = _one_leased(engine)
    define(engine, "other.job")
    rl.enqueue(engine, "other.job", {})
    [other] = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=1,
                                            job_types=["other.job"])

    with pytest.raises(errors.InvalidCompletionProgress) as raised:
        apply_transitions(engine, [(LeaseIdentity.of(other), Succeed(JobCompletion())), (lease, transition)])

    assert raised.value.code == "job.invalid_completion_progress"
    assert rows(engine, "SELECT DISTINCT status FROM job_queue") == [("LEASED",)]
    assert "SUCCEEDED" not in event_types(engine, other.id)


@pytest.mark.parametrize("transition, refused", [
    (Succeed(JobCompletion(checkpoint={"x": "y" * 2_000})), CheckpointTooLarge),
    (Continue(0, {"x": "y" * 2_000}), CheckpointTooLarge),
    (Succeed(JobCompletion(output={"x": "y" * 2_000})), OutputTooLarge),
], ids=["success-checkpoint", "continuation-checkpoint", "output"])
def test_a_checkpoint_or_output_over_its_limit_is_refused_before_anything_is_written(engine, transition, refused):
    job_id, lease = _one_leased(engine)
    with pytest.raises(refused):
        apply_transitions(engine, [(lease, transition)], max_output_bytes=1_000, max_checkpoint_bytes=1_000)
    stored = rl.get_job(engine, job_id)
    assert (stored.status, stored.checkpoint) == (rl.JobStatus.LEASED, {"saved": 1})


@pytest.mark.parametrize("transition", [LeaseLost("x.y", "lost"), Canceled("CANCELED"), "succeed"])
def test_a_transition_that_writes_nothing_is_refused_with_its_code(engine, transition):
    job_id, lease = _one_leased(engine)
    with pytest.raises(errors.InvalidArgument) as raised:
        apply_transitions(engine, [(lease, transition)])
    assert raised.value.code == "job.invalid_argument"
    assert rl.get_job(engine, job_id).status is rl.JobStatus.LEASED


def test_an_expired_but_held_lease_still_lands_its_outcome(engine):
    from tests.support import expire_lease

    job_id, lease = _one_leased(engine)
    expire_lease(engine, job_id)
    assert apply_transitions(engine, [(lease, Retry(JobFailure.retryable("x.y", "z"), 1_000))]) == [None]
    assert rl.get_job(engine, job_id).status is rl.JobStatus.PENDING


def test_no_items_write_nothing(engine):
    assert apply_transitions(engine, []) == []


@pytest.mark.parametrize("stranger", [None, "someone-else"], ids=["one-worker", "two-workers"])
def test_each_lease_of_a_mixed_group_gets_its_own_outcome_and_answer(engine, stranger):
    define(engine, "mix.job", max_attempts=3)
    for n in range(4):
        rl.enqueue(engine, "mix.job", {"n": n})
    claimed = sorted(claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=4,
                                                   job_types=["mix.job"]), key=lambda job: job.payload["n"])
    leases = [LeaseIdentity.of(job) for job in claimed]
    # Job 2's lease names an attempt it never had, and (two workers) job 3's another worker: both refused.
    leases[2] = LeaseIdentity(leases[2].job_id, leases[2].run_number, leases[2].attempt + 1, "w")
    if stranger is not None:
        leases[3] = LeaseIdentity(leases[3].job_id, leases[3].run_number, leases[3].attempt, stranger)
    transitions = [Retry(JobFailure.retryable("mix.later", "later"), 60_000), Succeed(JobCompletion(output={"n": 1})),
                   Succeed(JobCompletion()), _dead(JobFailure.terminal("mix.dead", "no"),
                                                   JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE)]

    answers = apply_transitions(engine, list(zip(leases, transitions, strict=True)))

    refused = [index for index, answer in enumerate(answers) if answer is not None]
    assert refused == ([2] if stranger is None else [2, 3])
    assert all(isinstance(answers[index], errors.LeaseOwnerMismatch) for index in refused)
    stored = [rl.get_job(engine, job.id) for job in claimed]
    assert [(job.status, job.output, job.last_error_code) for job in stored] == [
        (rl.JobStatus.PENDING, None, "mix.later"),
        (rl.JobStatus.SUCCEEDED, {"n": 1}, None),
        (rl.JobStatus.LEASED, None, None),
        (rl.JobStatus.LEASED, None, None) if stranger else (rl.JobStatus.DEAD_LETTERED, None, "mix.dead"),
    ]
