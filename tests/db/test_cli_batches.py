"""The ``batches`` commands and ``enqueue --batch`` against a real PostgreSQL: what they print, their exit codes."""

from __future__ import annotations

import json

import pytest

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from tests.support import claim_one, define, scalar

SEND, REPORT = "cli.send", "cli.report"
UNKNOWN_BATCH = "0190c6c2-5f1e-7000-8000-000000000000"


@pytest.fixture
def db(engine):
    define(engine, SEND, max_attempts=1)
    define(engine, REPORT)
    return engine


def end_one(engine, *, ok: bool) -> None:
    job = claim_one(engine, job_type=SEND)
    identity = LeaseIdentity.of(job).keywords()
    if ok:
        complete_job_success(engine, **identity)
    else:
        complete_job_failure(engine, **identity, failure=rl.JobFailure.terminal("cli.bounce", "bounced"),
                             retry_delay_ms=None)


def table(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the aligned table whose header starts with ``first``."""
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next(index for index, line in enumerate(lines) if line.split()[0] == first)
    header = lines[header_at]
    names = header.split()
    starts = [header.index(f"{name} " if name != names[-1] else name) for name in names]
    bounds = list(zip(starts, starts[1:] + [None], strict=True))
    return [{name: line[start:end].rstrip() for name, (start, end) in zip(names, bounds, strict=True)}
            for line in lines[header_at + 1:]]


def test_enqueue_with_batch_joins_it_and_a_closed_batch_refuses_with_a_hint(db, run):
    batch = rl.open_batch(db, on_success=(REPORT, {}))
    code, out, err = run("enqueue", SEND, '{"to": "a@example.com"}', "--batch", str(batch.id))
    assert code == 0, err
    assert scalar(db, "SELECT batch_id FROM job_queue WHERE id = :id", id=out.strip()) == batch.id
    rl.close_batch(db, batch.id)

    code, out, err = run("enqueue", SEND, "{}", "--batch", str(batch.id))
    lines = err.splitlines()
    assert code != 0 and out == "" and lines[0].startswith("error: batch.closed: ") and lines[1].startswith("hint: ")
    code, out, err = run("enqueue", SEND, "{}", "--batch", UNKNOWN_BATCH)
    assert err.startswith("error: batch.not_found: ") and "batches list" in err
    assert scalar(db, "SELECT count(*) FROM job_queue") == 1


def test_list_prints_batches_newest_first_with_their_counts_and_filters_by_status(db, run):
    older = rl.open_batch(db)
    for _ in range(3):
        rl.enqueue(db, SEND, batch=older.id)
    rl.close_batch(db, older.id)
    end_one(db, ok=True)
    end_one(db, ok=False)
    newer = rl.open_batch(db)

    code, out, _ = run("batches", "list")
    assert code == 0
    listed = table(out, "id")
    assert [(r["id"], r["status"], r["total"], r["pending"], r["succeeded"], r["failed"]) for r in listed] == [
        (str(newer.id), "OPEN", "0", "0", "0", "0"), (str(older.id), "CLOSED", "3", "1", "1", "1")]

    code, out, _ = run("batches", "list", "--status", "closed", "--json")
    [only] = [json.loads(line) for line in out.splitlines()]
    assert (code, only["id"], only["status"], only["pending"]) == (0, str(older.id), "CLOSED", 1)


def test_show_prints_progress_callbacks_and_the_first_members(db, run):
    batch = rl.open_batch(db, on_success=(REPORT, {"to": "ops"}), on_complete=(REPORT, {}), meta={"tenant": "acme"})
    for _ in range(4):
        rl.enqueue(db, SEND, batch=batch.id)
    rl.close_batch(db, batch.id)
    for _ in range(4):
        end_one(db, ok=True)
    done = rl.get_batch(db, batch.id)

    code, out, _ = run("batches", "show", str(batch.id), "--members", "2")
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
    fields = {label: value.strip() for label, value in fields.items()}
    assert (fields["status"], fields["progress"]) == ("SUCCEEDED", "4/4 ended (100%)")
    assert fields["on_success"] == f"{REPORT} (job {done.on_success_job_id})"
    assert fields["meta"] == '{"tenant": "acme"}'
    members = table(out, "job")
    assert len(members) == 2 and {m["status"] for m in members} == {"SUCCEEDED"}

    code, out, _ = run("batches", "show", str(batch.id), "--json")
    shown = json.loads(out)
    assert (code, shown["status"], shown["succeeded"], shown["on_success"]["job_type"]) == (0, "SUCCEEDED", 4, REPORT)


def test_show_of_an_unknown_or_malformed_batch_is_a_coded_error(db, run):
    code, out, err = run("batches", "show", UNKNOWN_BATCH)
    assert code != 0 and out == "" and err.startswith("error: batch.not_found: ")
    code, out, err = run("batches", "show", "nope")
    assert code != 0 and err.startswith("error: job.invalid_argument: ") and "batches list" in err


def test_batches_show_counts_and_lists_member_runs_apart_from_member_jobs(db, run):
    batch = rl.open_batch(db)
    rl.enqueue(db, SEND, batch=batch.id)
    wf = rl.Workflow("cli.flow")
    wf.job("only", SEND)
    run_record = rl.enqueue_workflow(db, wf, batch=batch.id)

    code, out, _ = run("batches", "show", str(batch.id))
    assert code == 0
    assert "runs:         1 of the members are workflow runs" in out
    assert "members (first 1 of 1):" in out and "member runs (first 1 of 1):" in out
    [shown] = table(out, "run")
    assert (shown["run"], shown["workflow"], shown["status"]) == (str(run_record.id), "cli.flow", "RUNNING")
    code, out, _ = run("batches", "show", str(batch.id), "--json")
    assert (json.loads(out)["total"], json.loads(out)["runs"]) == (2, 1)
