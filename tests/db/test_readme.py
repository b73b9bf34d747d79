"""The documentation's first-job, schedule and workflow blocks run as written (only the URL swapped for the test
database), and so does every command of the command-line reference's examples. Blocks are found by their
``<!-- docs-test: NAME -->`` marker, wherever they are (tests/db/test_docs.py)."""

from __future__ import annotations

import base64

import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from zoneinfo import ZoneInfo

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.claim.claim import claim_jobs
from tests.db.test_docs import REPO, marked, shell_lines
from tests.support import define, run_worker_until, wait_until


def readme_snippet(name: str) -> str:
    """The python block marked ``docs-test: name``."""
    return marked(name, "python")


def jobs_package(root: Path) -> Path:
    """Write the documentation's jobs module as ``myapp/jobs.py`` under ``root``; return ``root``."""
    package = root / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "jobs.py").write_text(readme_snippet("jobs-module"), encoding="utf-8")
    return root


def with_url(snippet: str, url: str) -> str:
    return snippet.replace('"postgresql://app@localhost/app"', repr(url))


def deploy_and_enqueue(url: str, root: Path, monkeypatch) -> dict:
    monkeypatch.syspath_prepend(str(jobs_package(root)))
    monkeypatch.delitem(sys.modules, "myapp", raising=False)
    monkeypatch.delitem(sys.modules, "myapp.jobs", raising=False)
    namespace: dict = {}
    code = with_url(readme_snippet("deploy"), url) + readme_snippet("enqueue")
    exec(compile(code, "docs:first-job", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


def test_first_job_snippets_deploy_enqueue_and_a_worker_runs_them(fresh_database, tmp_path, monkeypatch):
    namespace = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)
    engine, registry = namespace["engine"], namespace["registry"]
    try:
        assert rl.count_jobs(engine, job_type="email.send") == 2
        config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5)
        run_worker_until(engine, registry, config, lambda: rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 2)
        outputs = sorted(job.output["delivered_to"] for job in rl.list_jobs(engine))
        assert outputs == ["a@b.c", "b@c.d"]
    finally:
        engine.dispose()


def run_worker_process(argv: list[str], root: Path, engine, stop: int, **env_vars: str) -> None:
    """Run a worker process with ``root`` importable until both first-job jobs succeed; stop it with ``stop``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RUNLEDGER_")}
    env.update(RUNLEDGER_POLL_INTERVAL_MS="20", **env_vars)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), str(REPO), env.get("PYTHONPATH")]))
    worker = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: worker.poll() is not None
                   or rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 2, timeout=30)
        assert worker.poll() is None, worker.communicate()
        worker.send_signal(stop)
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, out + err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


def test_the_development_server_snippet_serves_the_command_line_until_enter(tmp_path, capsys):
    (tmp_path / "devdb.py").write_text(readme_snippet("dev-server"), encoding="utf-8")
    server = subprocess.Popen([sys.executable, "devdb.py"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        printed: list[str] = []
        reader = threading.Thread(target=lambda: printed.append(server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert printed and printed[0].startswith("export RUNLEDGER_DATABASE_URL="), (printed, server.poll())
        url = shlex.split(printed[0].split("=", 1)[1])[0]
        assert cli.main(["--database-url", url, "migrate"]) == 0  # what the guide's shells do with it
        assert cli.main(["--database-url", url, "check-schema"]) == 0
        assert "schema at" in capsys.readouterr().out
        _, err = server.communicate(input="\n", timeout=120)
        assert server.returncode == 0, err
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert cli.main(["--database-url", url, "check-schema"]) != 0  # Enter stopped it
    assert (tmp_path / ".pgdata").is_dir()


def test_the_jobs_module_as_the_workers_app_runs_the_jobs_and_enqueues_none(fresh_database, tmp_path, monkeypatch):
    engine = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)["engine"]
    try:
        run_worker_process(["-m", "runledger_sync.cli", "worker", "--app", "myapp.jobs:registry"], tmp_path, engine,
                           signal.SIGTERM, RUNLEDGER_DATABASE_URL=fresh_database)
        assert rl.count_jobs(engine) == 2
    finally:
        engine.dispose()


def cli_example_commands() -> list[list[str]]:
    """Every command of the command-line reference's examples, as argv lists (``a | b`` is two commands)."""
    commands = []
    for line in shell_lines(marked("cli-examples", "sh")):
        words = shlex.split(line)
        current: list[str] = []
        for word in words + ["|"]:
            if word == "|":
                commands.append(current if current[0] == "runledger-sync" else ["runledger-sync", *current])
                current = []
            else:
                current.append(word)
    return commands


def test_every_example_command_line_runs_as_written(fresh_database, capsys, tmp_path, monkeypatch):
    # The files the commands name (enqueue --payload-file payload.json).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "payload.json").write_text('{"to": "a@b.c"}')
    engine = rl.create_engine(fresh_database)
    try:
        define(engine, "email.send", max_attempts=1)
        rl.configure_queue(engine, "mail")  # enqueue --queue mail
        finished = rl.enqueue(engine, "email.send", {"to": "x@y.z"})
        [claimed] = claim_jobs(engine, worker_id="readme", lease_ttl_seconds=30, limit=1,
                                         job_types=["email.send"])
        complete_job_failure(engine, **LeaseIdentity.of(claimed).keywords(),
                                       failure=rl.JobFailure.terminal("smtp.rejected", "no such mailbox"),
                                       retry_delay_ms=None)
        # `jobs wait` exits 0 only for a job that succeeded.
        succeeded = rl.enqueue(engine, "email.send", {"to": "done@y.z"})
        [claimed] = claim_jobs(engine, worker_id="readme", lease_ttl_seconds=30, limit=1, job_types=["email.send"])
        complete_job_success(engine, **LeaseIdentity.of(claimed).keywords())
        commands = cli_example_commands()
        # Long-running ones have tests of their own (test_cli_worker.py, test_demo.py).
        runnable = [argv for argv in commands if argv[1] not in ("worker", "demo")]
        assert {argv[1] for argv in commands} >= {"migrate", "check-schema", "worker", "enqueue", "jobs",
                                                   "dead-letters", "stats", "demo", "workflows"}
        gate = rl.Workflow("gate")
        gate.external("approval")
        run_id = str(rl.enqueue_workflow(engine, gate).id)
        for argv in runnable:
            job_id = str(finished.id)
            if argv[1:3] == ["jobs", "cancel"]:
                job_id = str(rl.enqueue(engine, "email.send", {"to": "later@y.z"}).id)
            if argv[1:3] == ["jobs", "wait"]:
                job_id = str(succeeded.id)
            argv = [{"<id>": job_id, "<run>": run_id}.get(word, word) for word in argv[1:]]
            if argv[0] == "encryption":
                # Rotation needs keys, which a deployment gives every command in the environment.
                monkeypatch.setenv("RUNLEDGER_ENCRYPTION_KEYS", "k1:" + base64.b64encode(bytes(range(32))).decode())
            code = cli.main(["--database-url", fresh_database, *argv])
            out, err = capsys.readouterr()
            assert code == 0, f"runledger-sync {' '.join(argv)} exited {code}: {out}{err}"
        assert rl.get_job(engine, finished.id).status is rl.JobStatus.PENDING  # retried, then replayed none
        assert rl.count_jobs(engine, status=rl.JobStatus.CANCELED) == 1
    finally:
        engine.dispose()


def test_deploy_then_run_worker_snippets_run_every_job_and_ctrl_c_drains(fresh_database, tmp_path, monkeypatch):
    engine = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)["engine"]
    script = tmp_path / "worker.py"
    script.write_text(with_url(readme_snippet("deploy"), fresh_database) + readme_snippet("run-worker"), encoding="utf-8")
    try:
        run_worker_process([str(script)], tmp_path, engine, signal.SIGINT, RUNLEDGER_LEASE_TTL_SECONDS="5")
        assert sorted(job.output["delivered_to"] for job in rl.list_jobs(engine)) == ["a@b.c", "b@c.d"]
    finally:
        engine.dispose()


def test_schedules_snippet_declares_and_writes_its_schedules(fresh_database, tmp_path, monkeypatch):
    namespace = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)
    engine = namespace["engine"]
    try:
        exec(compile(readme_snippet("schedules"), "docs:schedules", "exec"), namespace)  # noqa: S102 - our own documentation
        found = {schedule.name: schedule for schedule in rl.list_schedules(engine)}
        assert sorted(found) == ["hourly-digest", "nightly-report"]
        nightly = found["nightly-report"]
        assert (nightly.timezone, nightly.source, nightly.is_active) == ("Europe/Berlin", "code", True)
        assert nightly.next_fire_at.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M:%S") == "02:30:00"
    finally:
        engine.dispose()


def run_snippets(namespace: dict, *names: str) -> None:
    for name in names:
        exec(compile(readme_snippet(name), f"docs:{name}", "exec"), namespace)  # noqa: S102 - our own documentation


def tree_column(table_text: str) -> list[tuple[str, str]]:
    """The step column (the tree) and the note column of a ``workflows show`` step table."""
    lines = [line for line in table_text.splitlines() if line.strip()]
    header = next(line for line in lines if line.split()[:2] == ["step", "kind"])
    kind_at, note_at = header.index("kind"), header.index("note")
    body = lines[lines.index(header) + 1:]
    return [(line[:kind_at].rstrip(), line[note_at:].rstrip()) for line in body]


def test_workflow_snippets_fan_out_fan_in_and_the_approval_gate_run_to_success(
        fresh_database, tmp_path, monkeypatch, capsys):
    namespace = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)
    engine, registry = namespace["engine"], namespace["registry"]
    try:
        run_snippets(namespace, "workflow-handlers")
        registry.sync_definitions(engine)
        run_snippets(namespace, "workflow-enqueue")
        run_id = namespace["run"].id
        config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5)

        def step_status(key: str) -> rl.WorkflowStepStatus:
            return rl.get_workflow_run(engine, run_id).step(key).status

        # The gate waits; the picks run meanwhile, and ship waits for the answer.
        picks = [f"pick-{w}" for w in namespace["warehouses"]]
        run_worker_until(engine, registry, config,
                         lambda: step_status("approval") is rl.WorkflowStepStatus.WAITING_FOR_EXTERNAL
                         and all(step_status(key) is rl.WorkflowStepStatus.SUCCEEDED for key in picks))
        assert step_status("ship") is rl.WorkflowStepStatus.BLOCKED
        # `workflows show` draws the tree the documentation shows.
        capsys.readouterr()
        assert cli.main(["--database-url", fresh_database, "workflows", "show", str(run_id)]) == 0
        shown = capsys.readouterr().out
        assert tree_column(shown) == tree_column(marked("workflow-show-tree", "text"))
        run_snippets(namespace, "workflow-approve")
        run_worker_until(engine, registry, config,
                         lambda: rl.get_workflow_run(engine, run_id).status is rl.WorkflowRunStatus.SUCCEEDED)

        final = rl.get_workflow_run(engine, run_id)
        assert final.step("ship").output == {"picked": 6, "approved_by": "ada"}
        assert final.step("notify").status is rl.WorkflowStepStatus.SUCCEEDED
        assert rl.count_jobs(engine, job_type="orders.pick") == 3
        assert rl.count_jobs(engine, job_type="orders.ship") == 1
    finally:
        engine.dispose()


def test_workflow_append_snippets_crawl_the_appended_pages_and_report_once_after_them(
        fresh_database, tmp_path, monkeypatch):
    namespace = deploy_and_enqueue(fresh_database, tmp_path, monkeypatch)
    engine, registry = namespace["engine"], namespace["registry"]
    try:
        run_snippets(namespace, "workflow-append-handlers")
        registry.sync_definitions(engine)
        run_snippets(namespace, "workflow-append-enqueue")
        run_id = namespace["crawl_run"].id
        config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5)

        run_worker_until(engine, registry, config,
                         lambda: rl.get_workflow_run(engine, run_id).status is rl.WorkflowRunStatus.SUCCEEDED)

        final = rl.get_workflow_run(engine, run_id)
        assert final.step("report").output == {"pages": 25, "words": 25 * 120}
        assert final.step("report").deps == ("list", "collect", *(f"page-{n}" for n in range(1, 26)))
        assert [(m.mutation_key, m.window, len(m.step_keys)) for m in final.mutations] == [("pages", "collect", 25)]
        assert rl.count_jobs(engine, job_type="crawl.page") == 25
        assert rl.count_jobs(engine, job_type="crawl.report") == 1
    finally:
        engine.dispose()


def test_the_workflows_complete_external_command_answers_the_gate_as_written(fresh_database, capsys):
    [line] = shell_lines(marked("workflow-complete-external", "sh"))
    engine = rl.create_engine(fresh_database)
    try:
        gate = rl.Workflow("gate")
        gate.external("approval")
        run = rl.enqueue_workflow(engine, gate)
        argv = [str(run.id) if word == "<run>" else word for word in shlex.split(line)[1:]]
        code = cli.main(["--database-url", fresh_database, *argv])
        out, err = capsys.readouterr()
        assert code == 0, out + err
        answered = rl.get_workflow_run(engine, run.id)
        assert answered.status is rl.WorkflowRunStatus.SUCCEEDED
        assert answered.step("approval").output == {"by": "ada"}
    finally:
        engine.dispose()
