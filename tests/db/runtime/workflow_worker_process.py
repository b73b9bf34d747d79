"""A worker process running workflow steps, for the kill test; written against the public API only.

Usage: ``python workflow_worker_process.py <database url>``

Each ``wf.step`` job takes STEP_SECONDS and stores its step key as output. The
process runs ``Supervisor.run_until_shutdown`` with a short lease (2 s) and
logs JSON lines to stderr.
"""

from __future__ import annotations

import os
import sys

import runledger_sync as rl

JOB_TYPE = "wf.step"
STEP_SECONDS = 0.5
LEASE_TTL_SECONDS = 2


def build_registry() -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=3)
    def step(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        ctx.wait_cancelled(STEP_SECONDS)
        ctx.check_cancelled()
        return rl.JobCompletion(output={"key": ctx.workflow.step_key})

    return registry


def config(worker_id: str) -> rl.JobsConfig:
    return rl.JobsConfig(
        worker_id=worker_id,
        poll_interval_ms=50,
        max_global_concurrency=2,
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        heartbeat_interval_seconds=0.5,
        reaper_interval_seconds=0.2,
        reaper_retry_delay_ms=1,
    )


def main(url: str) -> int:
    engine = rl.create_engine(url)
    rl.configure_logging(level="INFO", stream=sys.stderr)
    return rl.Supervisor(engine, build_registry(), config(f"proc-{os.getpid()}")).run_until_shutdown(drain_timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
