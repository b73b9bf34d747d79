"""A worker process for the fault tests, written against the public API only.

Usage: ``python worker_process.py <database url> <mode>``

* ``drain``: the handler of ``proc.job`` waits until a ``side_effects`` row with
  note ``go`` exists, then succeeds; SIGTERM starts a drain.
* ``hang``: the handler never returns (until the process is killed).

The process runs ``Supervisor.run_until_shutdown`` with a short lease
(2 s, heartbeat every 0.5 s) and logs JSON lines to stderr.
"""

from __future__ import annotations

import os
import sys
import time

from sqlalchemy import text

import runledger_sync as rl

JOB_TYPE = "proc.job"
LEASE_TTL_SECONDS = 2
HEARTBEAT_INTERVAL_SECONDS = 0.5


def main(url: str, mode: str) -> int:
    engine = rl.create_engine(url)
    registry = rl.JobRegistry()

    @registry.job(JOB_TYPE, max_attempts=3)
    def run(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if mode == "drain":
                with engine.connect() as conn:
                    if conn.execute(text("SELECT count(*) FROM side_effects WHERE note = 'go'")).scalar():
                        return rl.JobCompletion(output={"pid": os.getpid()})
            time.sleep(0.02)
        raise rl.JobFailure.terminal("proc.never_released", "the test never let the job finish")

    rl.configure_logging(level="INFO", stream=sys.stderr)
    config = rl.JobsConfig(
        worker_id=f"proc-{os.getpid()}",
        poll_interval_ms=50,
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        heartbeat_interval_seconds=HEARTBEAT_INTERVAL_SECONDS,
        reaper_interval_seconds=0.2,
        reaper_retry_delay_ms=1,
    )
    return rl.Supervisor(engine, registry, config).run_until_shutdown(drain_timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
