"""`runledger-sync worker --app module:registry` runs jobs and drains on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import runledger_sync as rl
from runledger_sync import cli
from tests.support import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_worker_command_runs_the_apps_jobs_and_exits_0_on_sigterm(engine, fresh_database):
    process = subprocess.Popen(
        [sys.executable, "-m", "runledger_sync.cli", "--database-url", fresh_database, "worker",
         "--app", "tests.cli_app:registry", "--poll-interval-ms", "20", "--concurrency", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
        assert '"message": "job processed"' in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _definition_exists(engine) -> bool:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM job_definitions WHERE job_type = 'cli.echo'").scalar() == 1


def test_worker_with_a_bad_app_is_a_config_error(fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "no_such_module:registry"])
    assert code == 1
    assert "error: config.invalid" in capsys.readouterr().err


def test_worker_with_an_invalid_option_reports_every_problem(fresh_database, capsys):
    code = cli.main(["--database-url", fresh_database, "worker", "--app", "tests.cli_app:registry",
                     "--concurrency", "0", "--claim-batch-size", "0"])
    assert code == 1
    err = capsys.readouterr().err
    assert "config.invalid" in err
    assert "max_global_concurrency" in err and "claim_batch_size" in err
