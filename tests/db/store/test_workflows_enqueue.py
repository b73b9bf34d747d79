"""Workflow enqueue and reads: the definition checked whole, one transaction, idempotent by key."""

from __future__ import annotations

import pytest
import sqlalchemy

import runledger_sync as rl
from runledger_sync.db.errors import translate
from runledger_sync.core.workflow import WorkflowRunStatus, WorkflowStepStatus
from tests.support import define, rows, scalar

TYPES = ("payments.charge", "shipping.send", "email.send")


@pytest.fixture
def typed(engine):
    for job_type in TYPES:
        define(engine, job_type)
    return engine


def order_workflow(key: str | None = "order-42") -> rl.Workflow:
    wf = rl.Workflow("order.fulfil", idempotency_key=key)
    charge = wf.job("charge", "payments.charge", {"order": 42})
    ship = wf.job("ship", "shipping.send", {"order": 42}, after=[charge], release="on_success")
    approve = wf.external("approval", after=[charge])
    wf.job("notify", "email.send", {"order": 42}, after=[ship, approve])
    return wf


def counts(engine) -> tuple[int, int, int, int]:
    return tuple(scalar(engine, f"SELECT count(*) FROM {table}") for table in (  # type: ignore[return-value]
        "workflow_runs", "workflow_steps", "workflow_step_dependencies", "job_queue"))


def test_enqueue_writes_run_steps_edges_and_only_the_root_job(typed):
    run = rl.enqueue_workflow(typed, order_workflow(), event_log="full")

    assert run.status is WorkflowRunStatus.RUNNING
    assert [(s.key, s.status) for s in run.steps] == [
        ("charge", WorkflowStepStatus.ENQUEUED), ("ship", WorkflowStepStatus.BLOCKED),
        ("approval", WorkflowStepStatus.BLOCKED), ("notify", WorkflowStepStatus.BLOCKED),
    ]
    assert run.step("notify").deps == ("ship", "approval")
    assert run.step("ship").release is rl.WorkflowReleaseMode.ON_SUCCESS
    assert counts(typed) == (1, 4, 4, 1)
    job = rl.get_job(typed, run.step("charge").job_id)
    assert (job.job_type, job.payload, job.workflow_step_id) == ("payments.charge", {"order": 42}, run.step("charge").id)
    assert [row.event_type for row in rows(typed, "SELECT event_type FROM job_events WHERE job_id = :id", id=job.id)] == [
        "ENQUEUED"]


def test_same_request_with_the_same_key_returns_the_existing_run(typed):
    first = rl.enqueue_workflow(typed, order_workflow())
    again = rl.enqueue_workflow(typed, order_workflow())

    assert again.id == first.id
    assert counts(typed) == (1, 4, 4, 1)


def test_a_different_request_with_the_same_key_is_a_conflict(typed):
    rl.enqueue_workflow(typed, order_workflow())
    other = rl.Workflow("order.fulfil", idempotency_key="order-42")
    other.job("charge", "payments.charge", {"order": 43})

    with pytest.raises(rl.errors.WorkflowEnqueueConflictingRetry) as caught:
        rl.enqueue_workflow(typed, other)

    assert caught.value.code == "workflow.enqueue_conflicting_retry"
    assert counts(typed) == (1, 4, 4, 1)


def test_enqueue_in_the_callers_transaction_exists_only_if_it_commits(typed):
    with typed.connect() as connection:
        with connection.begin() as transaction:
            run = rl.enqueue_workflow(connection, order_workflow(None))
            assert rl.get_workflow_run(connection, run.id) is not None
            transaction.rollback()

    assert rl.get_workflow_run(typed, run.id) is None
    assert counts(typed) == (0, 0, 0, 0)


def test_a_root_external_step_waits_and_the_run_says_so(typed):
    wf = rl.Workflow("approval.only")
    wf.external("approval")

    run = rl.enqueue_workflow(typed, wf)

    assert run.step("approval").status is WorkflowStepStatus.WAITING_FOR_EXTERNAL
    assert run.status is WorkflowRunStatus.WAITING_FOR_EXTERNAL


@pytest.mark.parametrize(
    ("build", "code"),
    [
        (lambda wf: None, "workflow.empty"),
        (lambda wf: (wf.job("a", "email.send"), wf.job("a", "email.send")), "workflow.duplicate_step_key"),
        (lambda wf: wf.job("a", "email.send", after=["missing"]), "workflow.unknown_dependency"),
        (lambda wf: wf.job("a", "email.send", after=[rl.Workflow("other").job("x", "email.send")]),
         "workflow.unknown_dependency"),
        (lambda wf: (wf.job("a", "email.send", after=["b"]), wf.job("b", "email.send", after=["a"])),
         "workflow.dependency_cycle"),
        (lambda wf: wf.job("a", "email.send", after=["a"]), "workflow.dependency_cycle"),
        (lambda wf: wf.job("a", "unknown.type"), "workflow.definition_not_found_or_disabled"),
        (lambda wf: wf.job("a", "email.send", release="sometimes"), "job.invalid_argument"),
        (lambda wf: wf.job("a", "email.send", {"bad": object()}), "job.invalid_payload"),
    ],
)
def test_a_bad_workflow_raises_its_code_and_writes_nothing(typed, build, code):
    wf = rl.Workflow("bad")
    try:
        build(wf)
    except rl.RunledgerError as refused_while_built:
        error = refused_while_built  # refused before enqueue_workflow could write anything
    else:
        # Checks only the whole workflow allows (cycles, unknown types) run at enqueue,
        # before its first row.
        with pytest.raises(rl.RunledgerError) as caught:
            rl.enqueue_workflow(typed, wf)
        error = caught.value
        assert counts(typed) == (0, 0, 0, 0)
    assert error.code == code


def test_a_disabled_job_type_is_refused_before_anything_is_written(typed):
    rl.set_job_definition_enabled(typed, "shipping.send", False)

    with pytest.raises(rl.errors.WorkflowDefinitionNotFoundOrDisabled):
        rl.enqueue_workflow(typed, order_workflow())

    assert counts(typed) == (0, 0, 0, 0)


def test_list_is_newest_first_filters_by_status_and_pages_with_before(typed):
    runs = [rl.enqueue_workflow(typed, order_workflow(f"order-{i}")) for i in range(3)]
    waiting = rl.Workflow("approval.only")
    waiting.external("approval")
    waiting_run = rl.enqueue_workflow(typed, waiting)

    listed = rl.list_workflow_runs(typed)
    assert [r.id for r in listed] == [waiting_run.id] + [r.id for r in reversed(runs)]
    assert [r.id for r in rl.list_workflow_runs(typed, status="WAITING_FOR_EXTERNAL")] == [waiting_run.id]
    page = rl.list_workflow_runs(typed, limit=2)
    assert [r.id for r in rl.list_workflow_runs(typed, limit=2, before=page[-1])] == [runs[1].id, runs[0].id]


def test_get_of_an_unknown_run_is_none_and_a_bad_id_is_refused(typed):
    assert rl.get_workflow_run(typed, "0193b6a0-0000-7000-8000-000000000000") is None
    with pytest.raises(rl.InvalidArgument):
        rl.get_workflow_run(typed, "not-a-uuid")


def test_the_linkage_trigger_refuses_a_job_pointing_at_a_step_that_does_not_point_back(typed):
    run = rl.enqueue_workflow(typed, order_workflow())
    plain = rl.enqueue(typed, "email.send", {})

    with pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
        with typed.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE job_queue SET workflow_step_id = :step WHERE id = :job"),
                               {"step": run.step("ship").id, "job": plain.id})

    assert isinstance(translate(caught.value), rl.errors.WorkflowLinkageSymmetryViolation)
    assert rl.get_job(typed, plain.id).workflow_step_id is None


def test_a_step_payload_over_the_payload_limit_is_refused_naming_the_step_and_nothing_is_written(typed):
    wf = rl.Workflow("big")
    wf.job("small", "payments.charge", {"n": 1})
    wf.job("huge", "payments.charge", {"blob": "x" * 2_000_000})

    with pytest.raises(rl.InvalidPayload) as raised:
        rl.enqueue_workflow(typed, wf)
    assert raised.value.code == "job.invalid_payload"
    assert "'huge'" in raised.value.message and "1048576 bytes" in raised.value.message
    assert "xxxx" not in raised.value.message
    assert counts(typed) == (0, 0, 0, 0)

    # The limit is the caller's, as enqueue's is.
    with pytest.raises(rl.InvalidPayload):
        rl.enqueue_workflow(typed, order_workflow(), max_payload_bytes=10)
    assert counts(typed) == (0, 0, 0, 0)
    run = rl.enqueue_workflow(typed, wf, max_payload_bytes=3_000_000)
    assert rl.get_job(typed, run.step("huge").job_id).payload == {"blob": "x" * 2_000_000}


def chain(steps: int) -> rl.Workflow:
    wf = rl.Workflow("long.chain")
    previous = None
    for number in range(steps):
        previous = wf.job(f"s{number}", "email.send", {"n": number}, after=[previous] if previous else [])
    return wf


def test_a_workflow_of_more_than_10000_steps_is_refused_and_nothing_is_written(typed):
    with pytest.raises(rl.errors.WorkflowTooManySteps) as raised:
        rl.enqueue_workflow(typed, chain(10_001))

    assert raised.value.code == "workflow.too_many_steps"
    assert "10001 steps" in raised.value.message and "at most 10000" in raised.value.message
    assert isinstance(raised.value, rl.errors.InvalidWorkflow)
    assert counts(typed) == (0, 0, 0, 0)


def test_a_chain_of_10000_steps_is_accepted(typed):
    run = rl.enqueue_workflow(typed, chain(10_000))
    assert counts(typed) == (1, 10_000, 9_999, 1)
    assert run.step("s0").job_id is not None


def test_step_payloads_over_64_mib_together_are_refused_and_nothing_is_written(typed):
    wf = rl.Workflow("big.together")
    blob = "x" * 1_040_000   # each payload under the 1 MiB limit of one payload; 65 of them over 64 MiB
    for number in range(65):
        wf.job(f"s{number}", "email.send", {"blob": blob})

    with pytest.raises(rl.errors.WorkflowTooLarge) as raised:
        rl.enqueue_workflow(typed, wf)

    assert raised.value.code == "workflow.too_large"
    assert "67108864 bytes" in raised.value.message and "'s64'" in raised.value.message
    assert "xxxx" not in raised.value.message
    assert counts(typed) == (0, 0, 0, 0)
