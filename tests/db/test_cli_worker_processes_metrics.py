"""`runledger-sync worker --processes 2 --metrics-port`: the parent's port serves the counts of both worker processes."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.metrics import MULTIPROCESS_DIR_PREFIX
from tests import process_app
from tests.db.test_cli_worker_processes import START_TIMEOUT, ParentProcess
from tests.support import rows, wait_until

QUICK_JOBS = 4


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body) for sample in family.samples}


def total(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return sum(value for (sample, pairs), value in samples.items()
               if sample == name and set(labels.items()) <= set(pairs))


def metrics_directories(temp: Path) -> list[str]:
    return [entry.name for entry in temp.iterdir() if entry.name.startswith(MULTIPROCESS_DIR_PREFIX)]


def test_the_parents_port_sums_the_succeeded_counts_of_both_processes_and_the_directory_goes_at_exit(
        engine, fresh_database, tmp_path):
    with engine.begin() as conn:
        for ddl in process_app.TABLES_DDL:
            conn.execute(text(ddl))
    temp = tmp_path / "tmp"
    temp.mkdir()
    # Port 0 picks a free one, which the parent logs: no window for another process to take it.
    parent = ParentProcess(fresh_database, "--metrics-port", "0", env={"TMPDIR": str(temp)})
    try:
        wait_until(lambda: len(parent.records("worker process started")) == 2 or parent.process.poll() is not None,
                   timeout=START_TIMEOUT)
        assert parent.process.poll() is None, "".join(parent.lines)
        [served] = parent.records("metrics served")
        assert served["host"] == "127.0.0.1"
        assert len(metrics_directories(temp)) == 1
        # One slot per child: both blockers running means each child holds one, so both count.
        blockers = [rl.enqueue(engine, "proc.block", {}) for _ in range(2)]
        wait_until(lambda: {row.worker_id for row in rows(engine, "SELECT worker_id FROM process_runs")}
                   == {"cli-p0", "cli-p1"}, timeout=START_TIMEOUT)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO process_gate VALUES (true)"))
        quick = [rl.enqueue(engine, "proc.quick", {}) for _ in range(QUICK_JOBS)]
        jobs = blockers + quick
        wait_until(lambda: all(rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED for job in jobs),
                   timeout=START_TIMEOUT)
        # Each counter moves just after its job's success commits, on the job's own thread.
        wait_until(lambda: total(scrape(served["port"]), "runledger_jobs_total", outcome="succeeded") == len(jobs),
                   timeout=10)
        samples = scrape(served["port"])
        parent.process.send_signal(signal.SIGTERM)
        assert parent.process.wait(30) == 0, "".join(parent.lines)
    finally:
        parent.close()
    assert total(samples, "runledger_jobs_total", outcome="succeeded") == len(jobs)
    assert total(samples, "runledger_jobs_total", job_type="proc.block", outcome="succeeded") == 2
    assert total(samples, "runledger_jobs_total", job_type="proc.quick", outcome="succeeded") == QUICK_JOBS
    assert total(samples, "runledger_job_handler_duration_seconds_count") == len(jobs)
    # The queue gauges are still the parent's own, read from the database.
    assert samples[("runledger_queue_up", ())] == 1
    assert metrics_directories(temp) == []
