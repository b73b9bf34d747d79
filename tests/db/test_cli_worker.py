"""`runledger-sync worker --app module:registry` runs jobs and drains on SIGTERM."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from tests.support import event_types, rows, scalar, wait_until

SECRET_WORD = "payload-secret-3b8d"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_worker_command_runs_the_apps_jobs_and_exits_0_on_sigterm(engine, fresh_database):
    # Two values the spec's fallback rule changes: each must be told, once, at start.
    env = {**os.environ, "JOBS_CLAIM_BATCH_SIZE": "5000", "JOBS_REAPER_INTERVAL_SECONDS": "soon"}
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "worker",
         "--app", "tests.cli_app:registry", "--poll-interval-ms", "20", "--concurrency", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        # The worker syncs the app's definitions itself; enqueue once they exist.
        wait_until(lambda: _definition_exists(engine) or process.poll() is not None, timeout=30)
        assert process.poll() is None, process.communicate()[1]
        job = rl.enqueue(engine, "cli.echo", {"say": "hi"})
        done = wait_until(lambda: (rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED) and rl.get_job(engine, job.id), timeout=30)
        assert done.output == {"echo": "hi"}
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        # Not a terminal: JSON lines, the summary rather than a line per job.
        assert '"logger": "runledger_sync.jobs"' not in stderr
        [summary] = [json.loads(line) for line in stderr.splitlines() if '"message": "jobs processed"' in line]
        assert summary["by_outcome"] == {"succeeded": 1} and summary["processed"] == 1
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        warnings = [(line["variable"], line["given"], line["used"]) for line in lines if line["level"] == "WARNING"]
        assert warnings == [("JOBS_CLAIM_BATCH_SIZE", "5000", 1000), ("JOBS_REAPER_INTERVAL_SECONDS", "soon", 15)]
        assert "JOBS_CLAIM_BATCH_SIZE='5000' is above the maximum of 1000; using 1000 instead" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _definition_exists(engine) -> bool:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM job_definitions WHERE job_type = 'cli.echo'").scalar() == 1


def test_worker_with_a_bad_app_is_a_usage_error_with_an_app_hint(fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "no_such_module:registry"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == "error: config.invalid: --app module 'no_such_module' could not be imported: " \
                       "No module named 'no_such_module'"
    assert lines[1].startswith("hint: --app takes module:attribute") and "--database-url" not in lines[1]


def test_worker_with_an_invalid_option_reports_every_problem(fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                     "--concurrency", "0", "--claim-batch-size", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "config.invalid" in err
    assert "max_global_concurrency" in err and "claim_batch_size" in err
    assert "--database-url" not in err


def test_worker_refuses_types_its_app_does_not_register(engine, fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                     "--types", "cli.echo,no.such,also.missing"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == ("error: config.invalid: --types names job types not registered in --app "
                        "tests.cli_app:registry: no.such, also.missing (registered: cli.echo)")
    assert not _definition_exists(engine)  # refused before the worker touched the database


def test_worker_refuses_unknown_types_from_the_environment_too(engine, fresh_database, capsys, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_JOB_TYPES", "no.such")

    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry"])

    assert code == 2
    assert "RUNLEDGER_JOB_TYPES names job types not registered" in capsys.readouterr().err


def test_strict_config_refuses_every_value_the_environment_would_have_bent(engine, fresh_database, capsys,
                                                                           monkeypatch):
    monkeypatch.setenv("JOBS_MAX_GLOBAL_CONCURRENCY", "abc")
    monkeypatch.setenv("JOBS_POLL_INTERVAL_MS", "0")

    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                     "--strict-config", "--lease-ttl-seconds", "0"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == (
        "error: config.invalid: JOBS_POLL_INTERVAL_MS='0' is below the minimum of 1; "
        "JOBS_MAX_GLOBAL_CONCURRENCY='abc' is not a whole number; "
        "jobs config lease_ttl_seconds must be >= 1, got 0.0")
    assert lines[1].startswith("hint: fix each value listed")
    assert not _definition_exists(engine)


def _start_worker(fresh_database, app: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "worker", "--app", app,
         "--poll-interval-ms", "20", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr


def _scheduled_jobs(engine) -> list:
    return [job for job in rl.list_jobs(engine) if "_schedule" in job.payload]


def test_worker_fires_the_apps_declared_schedules_unless_told_not_to(engine, fresh_database):
    quiet = _start_worker(fresh_database, "tests.cli_app:scheduled", "--no-scheduler")
    try:
        wait_until(lambda: rl.get_schedule(engine, "cli.every-second") is not None or quiet.poll() is not None,
                   timeout=30)
        assert quiet.poll() is None, quiet.communicate()[1]
        started = rl.get_schedule(engine, "cli.every-second").next_fire_at
        # Past two due instants: a scheduler would have fired by now.
        wait_until(lambda: scalar(engine, "SELECT now() > :t + interval '2 seconds'", t=started), timeout=10)
        assert _scheduled_jobs(engine) == []
        _stop(quiet)
    finally:
        if quiet.poll() is None:
            quiet.kill()
            quiet.communicate()
    firing = _start_worker(fresh_database, "tests.cli_app:scheduled")
    try:
        done = wait_until(lambda: [job for job in _scheduled_jobs(engine) if job.status is rl.JobStatus.SUCCEEDED],
                          timeout=30)
        assert done[0].output == {"echo": "tick"} and done[0].payload["_schedule"]["schedule_name"] == "cli.every-second"
        _stop(firing)
    finally:
        if firing.poll() is None:
            firing.kill()
            firing.communicate()


DRAIN_SECONDS = 2.0
GRACE_SECONDS = 1.0
#: Interpreter exit, closing connections, a busy shared machine.
EXIT_MARGIN_SECONDS = 3.0


def test_sigterm_past_the_drain_timeout_stops_running_jobs_and_exits_within_drain_plus_grace(engine, fresh_database):
    process = _start_worker(fresh_database, "tests.cli_app:stopping", "--concurrency", "4",
                            "--drain-timeout", str(DRAIN_SECONDS), "--timeout-grace-seconds", str(GRACE_SECONDS))
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_definitions") == 2 or process.poll() is not None,
                   timeout=30)
        assert process.poll() is None, process.communicate()[1]
        waiting = rl.enqueue(engine, "cli.wait_cancel", {})
        ignoring = rl.enqueue(engine, "cli.ignore_cancel", {})
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE stage = 'running'") == 2, timeout=30)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, stderr = process.communicate(timeout=DRAIN_SECONDS + GRACE_SECONDS + 30)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert DRAIN_SECONDS <= took < DRAIN_SECONDS + GRACE_SECONDS + EXIT_MARGIN_SECONDS, (took, stderr)
    assert process.returncode == 1, stderr  # the drain did not finish by itself
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    said = {(line["message"], line.get("job_id")) for line in lines}
    assert ("drain deadline reached; telling running jobs to stop", None) in said
    # The waiting handler woke at once and was queued again; the other was left behind.
    assert ("job stopped by the worker's shutdown; it runs again without spending an attempt", str(waiting.id)) in said
    assert ("job ignored its cancellation past the shutdown grace; leaving its lease to the reaper",
            str(ignoring.id)) in said
    # The job that stopped when told is pending again at once, its only attempt unspent (max_attempts=1).
    row = rl.get_job(engine, waiting.id)
    assert (row.status, row.attempt, row.last_error_code) == (rl.JobStatus.PENDING, 1, "job.worker_shutdown")
    assert "DEAD_LETTERED" not in event_types(engine, waiting.id)
    # Nothing was written for the one that ignored it: it keeps its lease, no failure.
    row = rl.get_job(engine, ignoring.id)
    assert (row.status, row.attempt, row.last_error_code) == (rl.JobStatus.LEASED, 1, None)
    assert "FAILED" not in event_types(engine, ignoring.id) and "DEAD_LETTERED" not in event_types(engine, ignoring.id)
    # Once its lease runs out the reaper hands it back, to run again.
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE job_queue SET lease_expires_at = now() - interval '1 second' WHERE status = 'LEASED'")
    reap_expired_leases(engine, limit=10, default_retry_delay_ms=1000)
    assert rl.get_job(engine, ignoring.id).status is rl.JobStatus.PENDING


def test_worker_on_a_terminal_prints_text_with_one_readable_line_per_finished_job(engine, fresh_database):
    controller, terminal = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key != "RUNLEDGER_LOG_FORMAT"}
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "worker",
         "--app", "tests.cli_app:registry", "--poll-interval-ms", "20"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal, env=env,
    )
    os.close(terminal)
    shown = bytearray()
    try:
        wait_until(lambda: _definition_exists(engine) or process.poll() is not None, timeout=30)
        job = rl.enqueue(engine, "cli.echo", {"say": SECRET_WORD})
        wanted = f"job cli.echo {job.id} succeeded (attempt 1, ".encode()
        while wanted not in shown and process.poll() is None:
            ready, _, _ = select.select([controller], [], [], 30)
            assert ready, f"the worker printed no line for its job in 30 s: {shown.decode(errors='replace')}"
            shown += os.read(controller, 65536)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)

    text = shown.decode(errors="replace")
    [line] = [line for line in text.splitlines() if wanted.decode() in line]
    assert " INFO runledger_sync.jobs job cli.echo " in line and line.rstrip().endswith(" ms)"), line
    assert not [line for line in text.splitlines() if line.startswith("{")]  # no JSON on a terminal
    assert "worker started worker_id=" in text  # the other lines keep their fields, as key=value
    assert SECRET_WORD not in text


def test_worker_refuses_a_log_format_variable_it_does_not_know_before_touching_the_database(
        fresh_database, capsys, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "xml")
    code = cli.main(["--database-url", "postgresql://nobody@127.0.0.1:1/nothing", "worker",
                     "--app", "tests.cli_app:registry"])

    err = capsys.readouterr().err
    assert code == 2
    assert "RUNLEDGER_LOG_FORMAT must be one of text, json, got 'xml'" in err


# -- queues ------------------------------------------------------------------------------


def test_worker_refuses_a_queue_that_does_not_exist_before_writing_anything(engine, fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                     "--queues", "default,mial"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0] == ("error: queue.not_found: --queues names a queue that does not exist: 'mial' (known: default); "
                        "a queue exists once a registry declares it (registry.queue) or a job type joins it, or once "
                        "configure_queue() creates it")
    assert lines[1] == ("hint: fix --queues: list the queues with `runledger-sync queues list`, or declare the queue "
                        "in --app with registry.queue()")
    assert not _definition_exists(engine)


def test_worker_refuses_an_unknown_queue_of_the_environments_queue_concurrency(engine, fresh_database, capsys,
                                                                               monkeypatch):
    monkeypatch.setenv("RUNLEDGER_QUEUE_CONCURRENCY", "default=2,mial=1")

    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry"])

    lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert lines[0].startswith("error: queue.not_found: RUNLEDGER_QUEUE_CONCURRENCY names a queue that does not "
                               "exist: 'mial'")
    assert lines[1].startswith("hint: fix RUNLEDGER_QUEUE_CONCURRENCY: ")


def _config_of(*options: str):
    from runledger_sync.cli import worker as worker_command

    args = cli.build_parser().parse_args(["worker", "--app", "tests.cli_app:queued", *options])
    return worker_command._worker_config(args, rl.load_registry("tests.cli_app:queued"))


def test_queue_options_and_variables_pass_through_to_the_jobs_config(monkeypatch):
    config = _config_of("--queues", "mail, default", "--queue-concurrency", "mail=2, default=4")
    assert (config.queues, config.queue_concurrency) == (("mail", "default"), {"mail": 2, "default": 4})

    monkeypatch.setenv("RUNLEDGER_QUEUES", "mail")
    monkeypatch.setenv("RUNLEDGER_QUEUE_CONCURRENCY", "mail=3")
    config = _config_of()
    assert (config.queues, config.queue_concurrency) == (("mail",), {"mail": 3})
    # An option wins over its variable.
    assert _config_of("--queues", "default").queues == ("default",)


def test_a_worker_of_one_queue_runs_its_jobs_only_and_its_row_says_so(engine, fresh_database, run):
    # The app declares "mail": known before the worker's own sync writes it.
    process = _start_worker(fresh_database, "tests.cli_app:queued", "--queues", "mail",
                            "--queue-concurrency", "mail=1")
    try:
        wait_until(lambda: _definition_exists(engine) or process.poll() is not None, timeout=30)
        assert process.poll() is None, process.communicate()[1]
        mail = rl.enqueue(engine, "cli.mail", {})
        echo = rl.enqueue(engine, "cli.echo", {"say": "hi"})
        wait_until(lambda: rl.get_job(engine, mail.id).status is rl.JobStatus.SUCCEEDED, timeout=30)
        [row] = wait_until(lambda: rows(engine, "SELECT queues, job_types FROM job_workers"), timeout=30)
        assert (row.queues, sorted(row.job_types)) == (["mail"], ["cli.echo", "cli.mail"])
        assert rl.get_job(engine, echo.id).status is rl.JobStatus.PENDING
        code, out, _ = run("jobs", "show", str(echo.id))
        assert code == 0
        assert "waits:               no_worker: no live worker serves queue 'default' and type 'cli.echo'" in out
        _stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert rows(engine, "SELECT worker_id FROM job_workers") == []
