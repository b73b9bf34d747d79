"""The README's first-job snippet runs as written (only the URL is swapped for the test database)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import runledger_sync as rl
from tests.support import wait_until

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- readme-test: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README has no snippet marked {name}"
    return match.group(1)


def test_first_job_snippet_enqueues_jobs_a_worker_then_runs(fresh_database):
    code = readme_snippet("first-job").replace('"postgresql://app@localhost/app"', repr(fresh_database))
    namespace: dict = {}
    exec(compile(code, "README.md:first-job", "exec"), namespace)  # noqa: S102 - our own README
    engine, registry = namespace["engine"], namespace["registry"]
    try:
        assert rl.count_jobs(engine, job_type="email.send") == 2
        config = rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5)
        shutdown = threading.Event()
        worker = threading.Thread(target=rl.run_worker_loop, args=(engine, registry, config, shutdown))
        worker.start()
        try:
            wait_until(lambda: rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) == 2, timeout=20)
        finally:
            shutdown.set()
            worker.join(20)
        outputs = sorted(job.output["delivered_to"] for job in rl.list_jobs(engine))
        assert outputs == ["a@b.c", "b@c.d"]
    finally:
        engine.dispose()
