"""The ``workflows`` commands against a real PostgreSQL: what they print, their exit codes, the rows they leave."""

from __future__ import annotations

import json

import pytest

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.workflow import WorkflowRunStatus as Run
from runledger_sync.core.workflow import WorkflowStepStatus as Step
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from tests.support import claim_one, define, rows, scalar

CHARGE, SHIP, NOTIFY = "cli.charge", "cli.ship", "cli.notify"
UNKNOWN_RUN = "0190c6c2-5f1e-7000-8000-000000000000"


@pytest.fixture
def db(engine):
    for job_type in (CHARGE, SHIP, NOTIFY):
        define(engine, job_type, max_attempts=1)
    return engine


def order(key: str = "order-42") -> rl.Workflow:
    """charge -> ship (on success) -> audit (on success); charge -> approval; notify after ship and approval."""
    wf = rl.Workflow("order.fulfil", idempotency_key=key)
    charge = wf.job("charge", CHARGE, {"order": 42})
    ship = wf.job("ship", SHIP, after=[charge], release="on_success")
    wf.job("audit", NOTIFY, after=[ship], release="on_success")
    approval = wf.external("approval", after=[charge])
    wf.job("notify", NOTIFY, after=[ship, approval])
    return wf


def succeed(engine, job_type: str) -> None:
    job = claim_one(engine, job_type=job_type)
    complete_job_success(engine, **LeaseIdentity.of(job).keywords(), completion=rl.JobCompletion())


def fail(engine, job_type: str, code: str) -> None:
    job = claim_one(engine, job_type=job_type)
    complete_job_failure(engine, **LeaseIdentity.of(job).keywords(),
                                   failure=rl.JobFailure.terminal(code, "it broke"), retry_delay_ms=None)


def waiting_for_approval(engine) -> rl.WorkflowRunRecord:
    run = rl.enqueue_workflow(engine, order())
    succeed(engine, CHARGE)
    assert rl.get_workflow_run(engine, run.id).step("approval").status is Step.WAITING_FOR_EXTERNAL
    return run


def table(text: str) -> list[dict[str, str]]:
    """The rows of the first aligned table in ``text``, each cell cut at its header's column."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next(index for index, line in enumerate(lines) if line.split()[:2] in (["step", "kind"], ["id", "name"]))
    header = lines[header_at]
    names = header.split()
    starts = [header.index(f"{name} " if name != names[-1] else name) for name in names]
    bounds = list(zip(starts, starts[1:] + [None], strict=True))
    return [{name: line[start:end].rstrip() for name, (start, end) in zip(names, bounds, strict=True)}
            for line in lines[header_at + 1:]]


def step_status(engine, run_id, key: str) -> tuple[str, object]:
    [row] = rows(engine, "SELECT status, output FROM workflow_steps WHERE run_id = :run AND step_key = :key",
                 run=run_id, key=key)
    return row.status, row.output


def assert_error(result: tuple[int, str, str], exit_code: int, code: str) -> list[str]:
    got, out, err = result
    lines = err.splitlines()
    assert (got, out) == (exit_code, ""), err
    assert lines[0].startswith(f"error: {code}: ") and lines[1].startswith("hint: "), err
    return lines


# -- list --------------------------------------------------------------------------


def test_list_prints_runs_newest_first_and_filters_by_status(db, run):
    older = rl.enqueue_workflow(db, order("first"))
    newer = rl.enqueue_workflow(db, order("second"))
    rl.cancel_workflow_run(db, older.id, reason="duplicate")

    code, out, _ = run("workflows", "list")
    assert code == 0
    listed = table(out)
    assert [(r["id"], r["status"], r["reason"]) for r in listed] == [
        (str(newer.id), "RUNNING", "-"), (str(older.id), "CANCELED", "duplicate")]
    assert {r["name"] for r in listed} == {"order.fulfil"}

    code, out, _ = run("workflows", "list", "--status", "canceled", "--json")
    assert code == 0
    [only] = [json.loads(line) for line in out.splitlines()]
    assert (only["id"], only["status"], only["status_reason"]) == (str(older.id), "CANCELED", "duplicate")

    code, out, _ = run("workflows", "list", "--limit", "1", "--json")
    assert code == 0 and [json.loads(line)["id"] for line in out.splitlines()] == [str(newer.id)]


def test_list_finds_a_run_that_waits_for_an_answer_by_its_status(db, run):
    wf = rl.Workflow("order.approve")
    approval = wf.external("approval", after=[wf.job("charge", CHARGE, {"order": 42})])
    wf.job("ship", SHIP, after=[approval], release="on_success")
    gated = rl.enqueue_workflow(db, wf)
    succeed(db, CHARGE)
    rl.enqueue_workflow(db, order())  # its charge is ENQUEUED: RUNNING

    code, out, _ = run("workflows", "list", "--status", "WAITING_FOR_EXTERNAL", "--json")

    assert code == 0
    assert [(r["id"], r["status"]) for r in map(json.loads, out.splitlines())] == [
        (str(gated.id), "WAITING_FOR_EXTERNAL")]


def test_list_keeps_to_an_organization(db, run):
    wf = rl.Workflow("order.fulfil", idempotency_key="a", organization_id="org-a")
    wf.job("charge", CHARGE, {"order": 1})
    mine = rl.enqueue_workflow(db, wf)
    rl.enqueue_workflow(db, order("no-org"))

    code, out, _ = run("workflows", "list", "--org", "org-a", "--json")
    assert code == 0 and [json.loads(line)["id"] for line in out.splitlines()] == [str(mine.id)]


def test_list_refuses_an_unknown_status_and_a_bad_limit(db, run):
    code, out, err = run("workflows", "list", "--status", "DONE")
    assert (code, out) == (2, "") and "invalid choice: 'DONE'" in err
    assert_error(run("workflows", "list", "--limit", "0"), 2, "job.invalid_argument")


# -- show --------------------------------------------------------------------------


def test_show_draws_each_step_under_its_prerequisite_with_kind_status_job_and_error(db, run):
    run_record = rl.enqueue_workflow(db, order())
    succeed(db, CHARGE)
    fail(db, SHIP, "shipping.down")  # audit, released only on success, is cancelled with it
    steps = rl.get_workflow_run(db, run_record.id)

    code, out, _ = run("workflows", "show", str(run_record.id))
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
    # Only the approval can move it now.
    assert (fields["status"].strip(), fields["name"].strip()) == ("WAITING_FOR_EXTERNAL", "order.fulfil")
    assert "steps (5):" in out
    drawn = [(r["step"], r["kind"], r["status"], r["job"], r["error"], r["note"]) for r in table(out)]
    assert drawn == [
        ("charge", "JOB", "SUCCEEDED", str(steps.step("charge").job_id), "-", "-"),
        ("|-- ship", "JOB", "FAILED", str(steps.step("ship").job_id), "shipping.down", "only on success"),
        ("|   `-- audit", "JOB", "CANCELED", "-", "workflow.dependency_unsatisfied", "only on success"),
        ("`-- approval", "EXTERNAL", "WAITING_FOR_EXTERNAL", "-", "-", "-"),
        ("    `-- notify", "JOB", "BLOCKED", "-", "-", "also after ship"),
    ]


def test_show_draws_a_fan_in_step_once_under_its_last_prerequisite(db, run):
    wf = rl.Workflow("fan")
    branches = [wf.job(f"b{i}", CHARGE, {"i": i}) for i in range(3)]
    wf.job("join", NOTIFY, after=branches)
    wf.job("report", NOTIFY, after=["join"])
    run_record = rl.enqueue_workflow(db, wf)

    code, out, _ = run("workflows", "show", str(run_record.id))
    assert code == 0
    assert [(r["step"], r["note"]) for r in table(out)] == [
        ("b0", "-"), ("b1", "-"), ("b2", "-"),
        ("`-- join", "also after b0, b1"),
        ("    `-- report", "-"),
    ]


def test_show_notes_appended_steps_and_lists_the_appends(db, run):
    wf = rl.Workflow("crawl")
    listing = wf.job("list", CHARGE)
    wf.job("report", NOTIFY, after=[listing, wf.external("collect")])
    run_record = rl.enqueue_workflow(db, wf)
    more = rl.WorkflowAppend(window="collect")
    for i in range(1, 8):
        more.job(f"page-{i}", SHIP, after=["list"])
    rl.append_workflow_steps(db, run_record.id, more, mutation_key="pages")

    code, out, _ = run("workflows", "show", str(run_record.id))
    _, shown, _ = run("workflows", "show", str(run_record.id), "--json")

    assert code == 0
    steps, appends = out.split("\nappends (1):\n")
    notes = {r["step"].strip(" |`-"): r["note"] for r in table(steps)}
    assert notes["page-1"] == "appended (pages)" and notes["list"] == "-"
    assert notes["report"].startswith("also after")
    [header, row] = appends.strip().splitlines()
    assert header.split() == ["append", "window", "steps", "created"]
    assert row.startswith("pages") and "collect" in row
    assert "page-1, page-2, page-3, page-4, page-5, ... (7 steps)" in row
    [mutation] = json.loads(shown)["mutations"]
    assert (mutation["mutation_key"], mutation["window"], len(mutation["step_keys"])) == ("pages", "collect", 7)


def test_show_prints_the_runs_metadata(db, run):
    workflow = rl.Workflow("order.meta", meta={"tenant": "acme"})
    workflow.external("approval")
    run_record = rl.enqueue_workflow(db, workflow)

    code, out, _ = run("workflows", "show", str(run_record.id))
    _, shown, _ = run("workflows", "show", str(run_record.id), "--json")

    assert code == 0
    assert 'meta:             {"tenant": "acme"}' in out
    assert json.loads(shown)["meta"] == {"tenant": "acme"}


def test_show_json_gives_the_run_with_every_step_and_its_deps(db, run):
    run_record = waiting_for_approval(db)
    code, out, _ = run("workflows", "show", str(run_record.id), "--json")
    assert code == 0
    shown = json.loads(out)
    assert (shown["id"], shown["status"]) == (str(run_record.id), "RUNNING")
    assert {s["key"]: (s["kind"], s["status"], s["deps"]) for s in shown["steps"]} == {
        "charge": ("JOB", "SUCCEEDED", []), "ship": ("JOB", "ENQUEUED", ["charge"]),
        "audit": ("JOB", "BLOCKED", ["ship"]), "approval": ("EXTERNAL", "WAITING_FOR_EXTERNAL", ["charge"]),
        "notify": ("JOB", "BLOCKED", ["ship", "approval"]),
    }


def test_show_escapes_control_characters_of_step_keys(db, run):
    wf = rl.Workflow("esc")
    wf.external("a\x1b[2Jb")
    run_record = rl.enqueue_workflow(db, wf)
    code, out, _ = run("workflows", "show", str(run_record.id))
    assert code == 0 and "\x1b" not in out and "a\\x1b[2Jb" in out



def chain(steps: int) -> rl.Workflow:
    wf = rl.Workflow("chain")
    for index in range(steps):
        wf.external(f"s{index}", after=[f"s{index - 1}"] if index else ())
    return wf


def test_show_draws_a_chain_of_thousands_of_steps_with_bounded_indentation(db, run):
    run_record = rl.enqueue_workflow(db, chain(5_000))

    code, out, _ = run("workflows", "show", str(run_record.id))
    assert code == 0
    drawn = table(out)
    assert len(drawn) == 5_000
    assert [row["step"].strip(" |`-") for row in drawn[:3]] == ["s0", "s1", "s2"]
    # Deep steps say their depth rather than being pushed thousands of columns right.
    assert drawn[-1]["step"].endswith("s4999") and "4999" in drawn[-1]["step"].split("s4999")[0]
    assert max(len(line) for line in out.splitlines()) < 300


# -- cancel ------------------------------------------------------------------------


def test_cancel_cancels_the_steps_not_started_and_their_pending_jobs(db, run):
    run_record = rl.enqueue_workflow(db, order())
    charge_job = run_record.step("charge").job_id

    code, out, _ = run("workflows", "cancel", str(run_record.id), "--reason", "duplicate")
    assert code == 0
    assert out == f"workflow run {run_record.id} canceled: duplicate\n"
    assert rows(db, "SELECT status, status_reason FROM workflow_runs")[0] == ("CANCELED", "duplicate")
    assert scalar(db, "SELECT count(*) FROM workflow_steps WHERE status <> 'CANCELED'") == 0
    assert rl.get_job(db, charge_job).status is rl.JobStatus.CANCELED

    # Again: the run is returned unchanged.
    assert run("workflows", "cancel", str(run_record.id))[0] == 0
    assert rows(db, "SELECT status, status_reason FROM workflow_runs")[0] == ("CANCELED", "duplicate")


def test_cancel_names_the_steps_left_running_to_their_end(db, run):
    run_record = rl.enqueue_workflow(db, order())
    claim_one(db, job_type=CHARGE)

    code, out, _ = run("workflows", "cancel", str(run_record.id))
    assert code == 0
    assert out.splitlines() == [f"workflow run {run_record.id} canceled: CANCELED", "still running, to their end: charge"]
    assert rl.get_job(db, run_record.step("charge").job_id).status is rl.JobStatus.LEASED


def test_cancel_refuses_a_finished_run_and_leaves_it(db, run):
    wf = rl.Workflow("one")
    wf.job("only", CHARGE)
    run_record = rl.enqueue_workflow(db, wf)
    succeed(db, CHARGE)

    lines = assert_error(run("workflows", "cancel", str(run_record.id)), 1, "workflow.run_finished")
    assert "SUCCEEDED" in lines[0]
    assert rl.get_workflow_run(db, run_record.id).status is Run.SUCCEEDED


# -- complete-external -----------------------------------------------------------


def test_complete_external_succeeds_the_step_with_its_output_and_releases_its_dependents(db, run):
    run_record = waiting_for_approval(db)
    succeed(db, SHIP)

    code, out, _ = run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
                       "--output", '{"by": "ada"}')
    assert code == 0
    assert out == f"step approval SUCCEEDED; workflow run {run_record.id} RUNNING\n"
    assert step_status(db, run_record.id, "approval") == ("SUCCEEDED", {"by": "ada"})
    assert step_status(db, run_record.id, "notify")[0] == "ENQUEUED"

    # The same answer again changes nothing and succeeds.
    assert run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
               "--output", '{"by": "ada"}')[0] == 0
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE job_type = :t", t=NOTIFY) == 2  # audit and notify


def test_complete_external_failed_ends_the_step_failed(db, run):
    run_record = waiting_for_approval(db)
    code, out, _ = run("workflows", "complete-external", str(run_record.id), "approval", "--failed")
    assert code == 0 and out.startswith("step approval FAILED;")
    [row] = rows(db, "SELECT status, error_code FROM workflow_steps WHERE step_key = 'approval'")
    assert tuple(row) == ("FAILED", "workflow.external_step_failed")


def test_complete_external_refuses_a_conflicting_answer_and_keeps_the_first(db, run):
    run_record = waiting_for_approval(db)
    assert run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
               "--output", '{"by": "ada"}')[0] == 0

    assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--failed"),
                 1, "workflow.external_step_conflicting_completion_retry")
    assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
                     "--output", '{"by": "bob"}'), 1, "workflow.external_step_conflicting_output_retry")
    assert step_status(db, run_record.id, "approval") == ("SUCCEEDED", {"by": "ada"})


def test_complete_external_refuses_an_output_over_the_configured_output_limit(db, run, monkeypatch):
    run_record = waiting_for_approval(db)
    monkeypatch.setenv("RUNLEDGER_MAX_OUTPUT_BYTES", "64")

    lines = assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
                             "--output", json.dumps({"by": "x" * 100})), 2, "job.output_too_large")
    assert "at most 64 bytes of JSON" in lines[0] and "RUNLEDGER_MAX_OUTPUT_BYTES" in lines[1]
    assert step_status(db, run_record.id, "approval") == ("WAITING_FOR_EXTERNAL", None)

    assert run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
               "--output", '{"by": "ada"}')[0] == 0


def test_complete_external_refuses_a_step_that_does_not_wait(db, run):
    run_record = rl.enqueue_workflow(db, order())  # charge has not run: approval is BLOCKED

    assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded"),
                 1, "workflow.external_step_not_waiting")
    assert_error(run("workflows", "complete-external", str(run_record.id), "charge", "--succeeded"),
                 1, "workflow.external_step_not_external")
    assert_error(run("workflows", "complete-external", str(run_record.id), "no-such", "--succeeded"),
                 1, "workflow.external_step_not_found")
    assert step_status(db, run_record.id, "approval") == ("BLOCKED", None)
    assert step_status(db, run_record.id, "charge") == ("ENQUEUED", None)


@pytest.mark.parametrize("output, problem", [
    ('{"by": ', "--output must be valid JSON (Expecting value at line 1 column 8)"),
    ('{"a": 1, "a": 2}', "--output must be JSON whose objects name each key once"),
    ("NaN", "output must be a JSON value, got a float that is NaN or infinite"),  # JSON that jsonb cannot keep
])
def test_complete_external_refuses_bad_json_output_and_writes_nothing(db, run, output, problem):
    run_record = waiting_for_approval(db)
    lines = assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded",
                             "--output", output), 2, "job.invalid_payload")
    assert problem in lines[0] and "{\"by\": \"ada\"}" in lines[1]
    assert step_status(db, run_record.id, "approval") == ("WAITING_FOR_EXTERNAL", None)


def test_complete_external_refuses_an_output_with_failed_and_a_missing_answer(db, run):
    run_record = waiting_for_approval(db)
    assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--failed",
                     "--output", "{}"), 2, "workflow.external_step_output_invalid_status")
    code, out, err = run("workflows", "complete-external", str(run_record.id), "approval")
    assert (code, out) == (2, "") and "one of the arguments --succeeded --failed is required" in err
    code, _, err = run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded", "--failed")
    assert code == 2 and "not allowed with argument" in err
    assert step_status(db, run_record.id, "approval") == ("WAITING_FOR_EXTERNAL", None)


def test_complete_external_during_a_cancel_fails_with_release_conflict(db, run):
    run_record = waiting_for_approval(db)
    with db.connect() as connection:
        with connection.begin() as transaction:
            rl.cancel_workflow_run(connection, run_record.id)
            lines = assert_error(run("workflows", "complete-external", str(run_record.id), "approval", "--succeeded"),
                                 1, "workflow.release_conflict")
            assert "again" in lines[1]
            transaction.rollback()
    assert step_status(db, run_record.id, "approval") == ("WAITING_FOR_EXTERNAL", None)


# -- every command: the run id -------------------------------------------------------

RUN_COMMANDS = [("show",), ("cancel",), ("complete-external", "approval", "--succeeded")]


@pytest.mark.parametrize("argv", RUN_COMMANDS, ids=lambda argv: argv[0])
def test_an_unknown_run_id_fails_with_run_not_found(db, run, argv):
    rl.enqueue_workflow(db, order())
    lines = assert_error(run("workflows", argv[0], UNKNOWN_RUN, *argv[1:]), 1, "workflow.run_not_found")
    assert UNKNOWN_RUN in lines[0] and "workflows list" in lines[1]
    assert scalar(db, "SELECT count(*) FROM workflow_runs WHERE status = 'RUNNING'") == 1


@pytest.mark.parametrize("argv", RUN_COMMANDS, ids=lambda argv: argv[0])
def test_a_run_id_that_is_no_uuid_is_bad_usage(db, run, argv):
    rl.enqueue_workflow(db, order())
    lines = assert_error(run("workflows", argv[0], "order-42", *argv[1:]), 2, "job.invalid_argument")
    assert "RUN_ID must be a workflow run id" in lines[0] and "workflows list" in lines[1]
    assert scalar(db, "SELECT count(*) FROM workflow_runs WHERE status = 'RUNNING'") == 1



def test_jobs_show_cuts_a_large_output_with_a_note_and_json_keeps_it_whole(db, run):
    run_record = rl.enqueue_workflow(db, order())
    job = claim_one(db, job_type=CHARGE)
    complete_job_success(db, **LeaseIdentity.of(job).keywords(),
                                   completion=rl.JobCompletion(output={"blob": "x" * 500_000}))
    job_id = str(rl.get_workflow_run(db, run_record.id).step("charge").job_id)

    code, out, _ = run("jobs", "show", job_id)
    assert code == 0 and len(out) < 20_000
    [output_line] = [line for line in out.splitlines() if line.startswith("output:")]
    assert "more characters not shown; --json prints the whole value" in output_line

    code, out, _ = run("jobs", "show", job_id, "--json")
    assert code == 0 and json.loads(out)["job"]["output"] == {"blob": "x" * 500_000}
