"""Every console command fed bad input: exit 2 (bad usage or configuration) or 1 (failed), two lines, no row changed.

The output contract (README "Command line"): stderr is exactly
``error: <code>: <message>`` then ``hint: <one line>``, never a traceback, and
nothing on stdout. tests/unit/test_cli_usage.py covers argparse-level usage
errors and bad JSON text; this table covers values that parse but that the
library refuses, and failures against a real database.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure
from tests.db.test_bad_input_api import FOUR_BYTES, HOSTILE, SURROGATE, TABLES, UNKNOWN_ID
from tests.db.test_bad_input_api import table_digest as queue_digest
from tests.support import define

JOB_TYPE = "cli.bad"
REPO = Path(__file__).resolve().parents[2]
WORKFLOW_TABLES = ("workflow_runs", "workflow_steps", "workflow_step_dependencies")
QUEUE_TABLES = ("job_queues", "job_workers")


def table_digest(engine: Any) -> dict[str, tuple[int, str]]:
    return queue_digest(engine, TABLES + WORKFLOW_TABLES + QUEUE_TABLES)


@pytest.fixture(scope="module")
def database(pg_server, template_database):
    # Shared by the whole table: each case asserts it left every row as it was.
    name = f"rl_bad_cli_{os.getpid()}"
    url = pg_server.create_database(name, template=template_database, drop_existing=True)
    engine = rl.create_engine(url)
    define(engine, JOB_TYPE, max_attempts=1)
    pending = rl.enqueue(engine, JOB_TYPE, {"n": 1})
    dead = rl.enqueue(engine, JOB_TYPE, {"n": 2}, priority=1_000_000)
    claimed = claim_jobs(engine, worker_id="seed", lease_ttl_seconds=60, limit=1, job_types=[JOB_TYPE])
    complete_job_failure(engine, **LeaseIdentity.of(claimed[0]).keywords(),
                         failure=rl.JobFailure.terminal("seed.failed", "seeded"), retry_delay_ms=None)
    gate = rl.Workflow("cli.bad.gate")
    gate.external("approval")  # a root external step: it waits for an answer from the start
    run = rl.enqueue_workflow(engine, gate)
    yield {"url": url, "engine": engine, "pending": str(pending.id), "dead": str(dead.id), "run": str(run.id)}
    engine.dispose()
    pg_server.drop_database(name)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("RUNLEDGER_DATABASE_URL", "DATABASE_URL", "RUNLEDGER_SCHEMA", "RUNLEDGER_MAX_PAYLOAD_BYTES"):
        monkeypatch.delenv(name, raising=False)


USAGE, FAILED = 2, 1

# (case id, argv with {pending}/{dead}/{run} placeholders, exit code, error code)
CASES: list[tuple[str, list[str], int, str]] = [
    ("enqueue-type-blank", ["enqueue", "", "{}"], USAGE, "job.invalid_job_type"),
    ("enqueue-type-spaces", ["enqueue", "   ", "{}"], USAGE, "job.invalid_job_type"),
    ("enqueue-type-bad-utf8", ["enqueue", "t." + SURROGATE, "{}"], USAGE, "job.invalid_job_type"),
    ("enqueue-type-too-long", ["enqueue", "t" * 256, "{}"], USAGE, "job.invalid_job_type"),
    ("enqueue-type-sql-unknown", ["enqueue", HOSTILE, "{}"], FAILED, "job.definition_not_found_or_disabled"),
    ("enqueue-json-nan", ["enqueue", JOB_TYPE, "NaN"], USAGE, "job.invalid_payload"),
    ("enqueue-json-infinity", ["enqueue", JOB_TYPE, '{"x": [Infinity]}'], USAGE, "job.invalid_payload"),
    ("enqueue-json-nul", ["enqueue", JOB_TYPE, '{"x": "a\\u0000b"}'], USAGE, "job.invalid_payload"),
    ("enqueue-json-lone-surrogate", ["enqueue", JOB_TYPE, '{"x": "\\ud800"}'], USAGE, "job.invalid_payload"),
    ("enqueue-json-over-1mib", ["enqueue", JOB_TYPE, '"' + "x" * 1_048_576 + '"'], USAGE, "job.invalid_payload"),
    ("enqueue-json-nested-10000", ["enqueue", JOB_TYPE, "[" * 10_000 + "]" * 10_000], USAGE, "job.invalid_payload"),
    ("enqueue-json-int-5000-digits", ["enqueue", JOB_TYPE, '{"n": ' + "9" * 5000 + "}"], USAGE,
     "job.invalid_payload"),
    ("enqueue-json-duplicate-keys", ["enqueue", JOB_TYPE, '{"a": {"1": "a", "1": "b"}}'], USAGE,
     "job.invalid_payload"),
    ("enqueue-payload-file-missing", ["enqueue", JOB_TYPE, "--payload-file", "/nonexistent/payload.json"], USAGE,
     "job.invalid_argument"),
    ("enqueue-payload-file-directory", ["enqueue", JOB_TYPE, "--payload-file", "/"], USAGE, "job.invalid_argument"),
    ("enqueue-type-10000-characters", ["enqueue", "t" * 10_000, "{}"], USAGE, "job.invalid_job_type"),
    ("enqueue-org-4-byte-over-bytes", ["enqueue", JOB_TYPE, "{}", "--org", FOUR_BYTES * 129], USAGE,
     "job.invalid_argument"),
    ("enqueue-key-4-byte-over-bytes", ["enqueue", JOB_TYPE, "{}", "--idempotency-key", FOUR_BYTES * 257], USAGE,
     "job.invalid_argument"),
    ("enqueue-org-blank", ["enqueue", JOB_TYPE, "{}", "--org", ""], USAGE, "job.invalid_argument"),
    ("enqueue-org-nul", ["enqueue", JOB_TYPE, "{}", "--org", "o\x00"], USAGE, "job.invalid_argument"),
    ("enqueue-org-bad-utf8", ["enqueue", JOB_TYPE, "{}", "--org", SURROGATE], USAGE, "job.invalid_argument"),
    ("enqueue-key-blank", ["enqueue", JOB_TYPE, "{}", "--idempotency-key", " "], USAGE, "job.invalid_argument"),
    ("enqueue-key-too-long", ["enqueue", JOB_TYPE, "{}", "--idempotency-key", "k" * 513], USAGE,
     "job.invalid_argument"),
    ("enqueue-priority-huge", ["enqueue", JOB_TYPE, "{}", "--priority", "99999999999"], USAGE,
     "job.invalid_argument"),
    ("enqueue-max-attempts-huge", ["enqueue", JOB_TYPE, "{}", "--max-attempts", "1001"], USAGE,
     "job.invalid_argument"),
    ("enqueue-delay-nan", ["enqueue", JOB_TYPE, "{}", "--delay-seconds", "nan"], USAGE, "job.invalid_argument"),
    ("enqueue-delay-inf", ["enqueue", JOB_TYPE, "{}", "--delay-seconds", "inf"], USAGE, "job.invalid_argument"),
    ("enqueue-delay-negative", ["enqueue", JOB_TYPE, "{}", "--delay-seconds", "-1"], USAGE, "job.invalid_argument"),
    ("list-type-blank", ["jobs", "list", "--type", ""], USAGE, "job.invalid_job_type"),
    ("list-type-bad-utf8", ["jobs", "list", "--type", SURROGATE], USAGE, "job.invalid_job_type"),
    ("list-org-spaces", ["jobs", "list", "--org", "  "], USAGE, "job.invalid_argument"),
    ("list-limit-zero", ["jobs", "list", "--limit", "0"], USAGE, "job.invalid_argument"),
    ("list-limit-huge", ["jobs", "list", "--limit", "1000001"], USAGE, "job.invalid_argument"),
    ("show-id-sql", ["jobs", "show", "'; DROP TABLE job_queue; --"], USAGE, "job.invalid_argument"),
    ("show-unknown", ["jobs", "show", UNKNOWN_ID], FAILED, "job.not_found"),
    ("retry-unknown", ["jobs", "retry", UNKNOWN_ID], FAILED, "job.not_found"),
    ("retry-pending", ["jobs", "retry", "{pending}"], FAILED, "job.invalid_state_transition"),
    ("retry-reason-blank", ["jobs", "retry", "{dead}", "--reason", ""], USAGE, "job.invalid_argument"),
    ("cancel-finished", ["jobs", "cancel", "{dead}"], FAILED, "job.invalid_state_transition"),
    ("cancel-reason-too-long", ["jobs", "cancel", "{pending}", "--reason", "r" * 256], USAGE,
     "job.invalid_argument"),
    ("cancel-reason-bad-utf8", ["jobs", "cancel", "{pending}", "--reason", SURROGATE], USAGE,
     "job.invalid_argument"),
    ("dead-list-limit-zero", ["dead-letters", "list", "--limit", "0"], USAGE, "job.invalid_argument"),
    ("dead-list-type-blank", ["dead-letters", "list", "--type", ""], USAGE, "job.invalid_job_type"),
    ("dead-list-org-blank", ["dead-letters", "list", "--org", ""], USAGE, "job.invalid_argument"),
    ("dead-list-since-bad-month", ["dead-letters", "list", "--since", "2026-13-01"], USAGE, "job.invalid_argument"),
    ("dead-replay-type-blank", ["dead-letters", "replay", "--type", " "], USAGE, "job.invalid_job_type"),
    ("dead-replay-org-bad-utf8", ["dead-letters", "replay", "--org", SURROGATE], USAGE, "job.invalid_argument"),
    ("stats-org-blank", ["stats", "--org", ""], USAGE, "job.invalid_argument"),
    ("stats-org-nul", ["stats", "--org", "\x00"], USAGE, "job.invalid_argument"),
    ("workflows-list-limit-zero", ["workflows", "list", "--limit", "0"], USAGE, "job.invalid_argument"),
    ("workflows-show-id-sql", ["workflows", "show", "'; DROP TABLE workflow_runs; --"], USAGE,
     "job.invalid_argument"),
    ("workflows-show-unknown", ["workflows", "show", UNKNOWN_ID], FAILED, "workflow.run_not_found"),
    ("workflows-cancel-unknown", ["workflows", "cancel", UNKNOWN_ID], FAILED, "workflow.run_not_found"),
    ("workflows-cancel-reason-too-long", ["workflows", "cancel", "{run}", "--reason", "r" * 256], USAGE,
     "job.invalid_argument"),
    ("workflows-cancel-reason-bad-utf8", ["workflows", "cancel", "{run}", "--reason", SURROGATE], USAGE,
     "job.invalid_argument"),
    ("workflows-complete-unknown-run", ["workflows", "complete-external", UNKNOWN_ID, "approval", "--succeeded"],
     FAILED, "workflow.run_not_found"),
    ("workflows-complete-step-blank", ["workflows", "complete-external", "{run}", " ", "--succeeded"], USAGE,
     "job.invalid_argument"),
    ("workflows-complete-step-bad-utf8", ["workflows", "complete-external", "{run}", SURROGATE, "--succeeded"],
     USAGE, "job.invalid_argument"),
    ("workflows-complete-step-sql-unknown", ["workflows", "complete-external", "{run}", HOSTILE, "--succeeded"],
     FAILED, "workflow.external_step_not_found"),
    ("workflows-complete-output-nan", ["workflows", "complete-external", "{run}", "approval", "--succeeded",
                                       "--output", "NaN"], USAGE, "job.invalid_payload"),
    ("workflows-complete-output-nul", ["workflows", "complete-external", "{run}", "approval", "--succeeded",
                                       "--output", '"a\\u0000b"'], USAGE, "job.invalid_payload"),
    ("workflows-complete-output-duplicate-keys", ["workflows", "complete-external", "{run}", "approval",
                                                  "--succeeded", "--output", '{"a": 1, "a": 2}'], USAGE,
     "job.invalid_payload"),
    ("workflows-complete-output-with-failed", ["workflows", "complete-external", "{run}", "approval", "--failed",
                                               "--output", "{}"], USAGE, "workflow.external_step_output_invalid_status"),
    ("worker-bad-number", ["worker", "--app", "tests.cli_app:registry", "--lease-ttl-seconds", "soon"], USAGE,
     "config.invalid"),
    ("worker-bad-bool", ["worker", "--app", "tests.cli_app:registry", "--log-payloads", "maybe"], USAGE,
     "config.invalid"),
    ("worker-app-sql", ["worker", "--app", "os:system'; --"], USAGE, "config.invalid"),
    ("worker-unknown-type", ["worker", "--app", "tests.cli_app:registry", "--types", "cli.echo,no.such"], USAGE,
     "config.invalid"),
    ("worker-unknown-queue", ["worker", "--app", "tests.cli_app:registry", "--queues", "default,no.such"], USAGE,
     "queue.not_found"),
    ("worker-unknown-queue-sql", ["worker", "--app", "tests.cli_app:registry", "--queues", HOSTILE], USAGE,
     "queue.not_found"),
    ("worker-unknown-queue-concurrency", ["worker", "--app", "tests.cli_app:registry", "--queue-concurrency",
                                          "no.such=2"], USAGE, "queue.not_found"),
    ("worker-queue-concurrency-no-count", ["worker", "--app", "tests.cli_app:registry", "--queue-concurrency",
                                           "default"], USAGE, "config.invalid"),
    ("worker-queue-concurrency-zero", ["worker", "--app", "tests.cli_app:registry", "--queue-concurrency",
                                       "default=0"], USAGE, "config.invalid"),
    ("worker-queues-blank", ["worker", "--app", "tests.cli_app:registry", "--queues", " "], USAGE, "config.invalid"),
    ("queues-show-unknown", ["queues", "show", "no.such"], FAILED, "queue.not_found"),
    ("queues-show-blank", ["queues", "show", ""], USAGE, "queue.invalid_name"),
    ("queues-show-too-long", ["queues", "show", "q" * 129], USAGE, "queue.invalid_name"),
    ("queues-pause-unknown", ["queues", "pause", HOSTILE], FAILED, "queue.not_found"),
    ("queues-pause-bad-utf8", ["queues", "pause", SURROGATE], USAGE, "queue.invalid_name"),
    ("queues-resume-unknown", ["queues", "resume", "no.such"], FAILED, "queue.not_found"),
    ("queues-set-unknown", ["queues", "set", "no.such", "--global-limit", "2"], FAILED, "queue.not_found"),
    ("queues-set-nothing", ["queues", "set", "default"], USAGE, "config.invalid"),
    ("queues-set-limit-zero", ["queues", "set", "default", "--global-limit", "0"], USAGE, "queue.invalid_setting"),
    ("queues-set-limit-negative", ["queues", "set", "default", "--key-limit", "-1"], USAGE, "queue.invalid_setting"),
    ("queues-set-limit-word", ["queues", "set", "default", "--key-limit", "many"], USAGE, "queue.invalid_setting"),
    ("queues-set-limit-huge", ["queues", "set", "default", "--global-limit", "1000001"], USAGE,
     "queue.invalid_setting"),
    ("queues-set-rate-zero", ["queues", "set", "default", "--rate", "0/60s"], USAGE, "queue.invalid_setting"),
    ("queues-set-rate-zero-window", ["queues", "set", "default", "--rate", "10/0s"], USAGE, "queue.invalid_setting"),
    ("queues-set-rate-word", ["queues", "set", "default", "--rate", "fast"], USAGE, "queue.invalid_setting"),
    ("queues-set-per-key-alone", ["queues", "set", "default", "--per-key"], USAGE, "config.invalid"),
    ("queues-set-create-blank", ["queues", "set", " ", "--create"], USAGE, "queue.invalid_name"),
]


def invoke(capsys, database: dict[str, Any], argv: list[str]) -> tuple[int, str, str]:
    argv = [part.replace("{pending}", database["pending"]).replace("{dead}", database["dead"])
            .replace("{run}", database["run"]) for part in argv]
    code = cli.main(["--database-url", database["url"], *argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_two_line_error(err: str, code: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(f"error: {code}: "), lines[0]
    assert lines[1].startswith("hint: ") and len(lines[1]) > len("hint: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "exit_code", "code"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_command_input_exits_with_its_code_and_changes_no_row(capsys, database, argv, exit_code, code):
    before = table_digest(database["engine"])

    status, out, err = invoke(capsys, database, argv)

    assert status == exit_code, err
    assert out == ""
    assert_two_line_error(err, code)
    assert table_digest(database["engine"]) == before


def test_case_ids_are_unique():
    assert len({case[0] for case in CASES}) == len(CASES)


def test_enqueue_applies_the_configured_payload_limit(capsys, database, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_MAX_PAYLOAD_BYTES", "64")
    before = table_digest(database["engine"])

    status, out, err = invoke(capsys, database, ["enqueue", JOB_TYPE, '{"x": "' + "y" * 60 + '"}'])

    assert (status, out) == (USAGE, "")
    assert_two_line_error(err, "job.invalid_payload")
    assert "at most 64 bytes" in err
    assert table_digest(database["engine"]) == before


def test_sql_metacharacters_in_cli_filters_find_nothing_and_change_nothing(capsys, database):
    before = table_digest(database["engine"])
    for argv in (["jobs", "list", "--type", HOSTILE, "--json"], ["jobs", "list", "--org", "' OR '1'='1", "--json"],
                 ["dead-letters", "list", "--type", "%", "--json"], ["dead-letters", "replay", "--org", "x' OR 1=1 --"]):
        status, out, err = invoke(capsys, database, argv)
        assert status == 0, err
        assert out.strip() in ("", "requeued 0 dead-lettered job(s)")
    assert table_digest(database["engine"]) == before


def test_the_real_script_turns_undecodable_argv_bytes_into_a_coded_usage_error(database):
    # A shell passes bytes; 0xFF is not UTF-8, so Python hands the command a lone surrogate.
    argv = [sys.executable, "-m", "runledger_sync.cli", "--database-url", database["url"], "enqueue",
            os.fsencode("t.") + b"\xff", "{}"]
    before = table_digest(database["engine"])

    result = subprocess.run(argv, capture_output=True, cwd=REPO, timeout=60,  # noqa: S603 - our own script
                            env={**os.environ, "PYTHONUTF8": "0", "LC_ALL": "C.UTF-8"})

    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == USAGE, err
    assert result.stdout == b""
    assert_two_line_error(err.replace("\r", ""), "job.invalid_job_type")
    assert table_digest(database["engine"]) == before


# -- the payload from a file or standard input --------------------------------------


def test_enqueue_reads_a_payload_over_the_argument_limit_from_a_file(capsys, database, tmp_path):
    # Larger than one argv string may be (about 128 KiB on Linux).
    payload = {"rows": ["r" * 100 for _ in range(3_000)], "name": FOUR_BYTES}
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")

    status, out, err = invoke(capsys, database, ["enqueue", JOB_TYPE, "--payload-file", str(path)])

    assert status == 0, err
    assert rl.get_job(database["engine"], out.strip()).payload == payload


@pytest.mark.parametrize("argv", [["--payload-file", "-"], ["-"]], ids=["payload-file-dash", "json-dash"])
def test_enqueue_reads_the_payload_from_standard_input(capsys, database, monkeypatch, argv):
    payload = {"from": "stdin", "n": [1, 2]}
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(payload).encode())))

    status, out, err = invoke(capsys, database, ["enqueue", JOB_TYPE, *argv])

    assert status == 0, err
    assert rl.get_job(database["engine"], out.strip()).payload == payload


@pytest.mark.parametrize(
    ("content", "code"),
    [(b"\xff\xfe{}", "job.invalid_payload"), (b"[" * 10_000, "job.invalid_payload"), (b"{'a': 1}", "job.invalid_payload")],
    ids=["not-utf8", "nested-10000", "not-json"],
)
def test_a_bad_payload_file_is_a_usage_error_and_writes_nothing(capsys, database, tmp_path, content, code):
    path = tmp_path / "payload.json"
    path.write_bytes(content)
    before = table_digest(database["engine"])

    status, out, err = invoke(capsys, database, ["enqueue", JOB_TYPE, "--payload-file", str(path)])

    assert (status, out) == (USAGE, "")
    assert_two_line_error(err, code)
    assert table_digest(database["engine"]) == before


def test_payload_file_and_json_argument_are_mutually_exclusive(capsys, database, tmp_path):
    path = tmp_path / "payload.json"
    path.write_text("{}")
    before = table_digest(database["engine"])

    status, out, err = invoke(capsys, database, ["enqueue", JOB_TYPE, "{}", "--payload-file", str(path)])

    assert (status, out) == (USAGE, "")
    assert "not allowed with argument JSON" in err
    assert table_digest(database["engine"]) == before


# -- control characters from stored data ----------------------------------------------

ESCAPE = "\x1b[2J\x1b]0;owned\x07"
SHOWN = "\\x1b[2J\\x1b]0;owned\\x07"


@pytest.fixture
def hostile_rows(engine):
    """A dead-lettered job whose type, organization, error code and message hold terminal escapes."""
    job_type = "t" + ESCAPE
    define(engine, job_type, max_attempts=1)
    job = rl.enqueue(engine, job_type, {}, organization_id="org" + ESCAPE)
    claimed = claim_jobs(engine, worker_id="w", lease_ttl_seconds=60, limit=1, job_types=[job_type])
    complete_job_failure(engine, **LeaseIdentity.of(claimed[0]).keywords(), retry_delay_ms=None,
                         failure=rl.JobFailure.terminal("code" + ESCAPE, "upstream said " + ESCAPE + "\u202e"))
    return {"url": engine.url.render_as_string(hide_password=False), "job": str(job.id), "org": "org" + ESCAPE}


@pytest.mark.parametrize(
    "argv",
    [["jobs", "list"], ["jobs", "show", "{job}"], ["stats"], ["stats", "--org", "{org}"], ["dead-letters", "list"]],
    ids=["jobs-list", "jobs-show", "stats", "stats-org", "dead-letters-list"],
)
def test_tables_escape_control_characters_from_stored_data(capsys, hostile_rows, argv):
    argv = [part.replace("{job}", hostile_rows["job"]).replace("{org}", hostile_rows["org"]) for part in argv]

    status = cli.main(["--database-url", hostile_rows["url"], *argv])
    out, err = capsys.readouterr()

    assert status == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert SHOWN in out


@pytest.mark.parametrize("argv", [["jobs", "list", "--json"], ["dead-letters", "list", "--json"]],
                         ids=["jobs-list", "dead-letters-list"])
def test_json_output_keeps_the_stored_text_exactly(capsys, hostile_rows, argv):
    status = cli.main(["--database-url", hostile_rows["url"], *argv])
    out, err = capsys.readouterr()

    assert status == 0, err
    [record] = [json.loads(line) for line in out.splitlines()]
    assert record["job_type"] == "t" + ESCAPE
    assert record["organization_id"] == "org" + ESCAPE
