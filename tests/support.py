"""Small helpers shared by the database tests: seed definitions, read rows back."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator

from sqlalchemy import text

import runledger_sync as rl

from runledger_sync.core.records import JobDefinition, LeaseIdentity
from runledger_sync.logging import ROOT_LOGGER_NAME
from runledger_sync.runtime.worker.loop import run_worker_loop
from runledger_sync.store.definitions import sync_job_definitions
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.prepared import PLAN_ONCE_SQL

JOB_TYPE = "test.job"


def without_plan_settings(sql: str) -> str:
    """A prepared statement's text as sent, without the planner settings the store sends ahead of it."""
    return sql.removeprefix(PLAN_ONCE_SQL + "; ")


def define(engine: Any, job_type: str = JOB_TYPE, **overrides: Any) -> JobDefinition:
    return sync_job_definitions(engine, [JobDefinition(job_type, **overrides)])[0]


def claim_one(engine: Any, *, worker_id: str = "worker-a", lease_ttl_seconds: float = 30, prestart: bool = True,
              job_type: str = JOB_TYPE, **level: Any):
    """Claim the one claimable job of ``job_type``; ``level`` is the claim's ``event_log``, if given."""
    claim = claim_prestart_jobs_for_types if prestart else claim_jobs
    jobs = claim(engine, worker_id=worker_id, lease_ttl_seconds=lease_ttl_seconds, limit=1, job_types=[job_type],
                 **level)
    assert len(jobs) == 1, f"expected one claimable {job_type} job, got {len(jobs)}"
    return jobs[0]


def identity(job: Any) -> dict[str, Any]:
    return LeaseIdentity.of(job).keywords()


def rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def scalar(engine: Any, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def events(engine: Any, job_id: Any) -> list[tuple[str, Any, dict]]:
    return [
        (row.event_type, row.attempt, row.payload)
        for row in rows(engine, "SELECT event_type, attempt, payload FROM job_events WHERE job_id = :id ORDER BY id", id=job_id)
    ]


def event_types(engine: Any, job_id: Any) -> list[str]:
    return [event[0] for event in events(engine, job_id)]


def attempts(engine: Any, job_id: Any) -> list[Any]:
    return rows(engine, "SELECT * FROM job_attempts WHERE job_id = :id ORDER BY run_number, attempt", id=job_id)


def expire_lease(engine: Any, job_id: Any, seconds_ago: float = 1.0) -> None:
    """Move a lease's expiry into the past, as if its worker had stopped renewing it."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE job_queue SET lease_expires_at = now() - make_interval(secs => :s) WHERE id = :id"),
            {"s": seconds_ago, "id": job_id},
        )


class ClaimWatch:
    """A worker observer that notes when each claim came back, so a test can wait for the worker's next claim.

    Times are ``time.time()``, comparable with a log record's ``created``.
    """

    def __init__(self) -> None:
        self.claimed_at: list[float] = []

    def claimed(self, jobs: Any) -> None:
        self.claimed_at.append(time.time())

    def claims_since(self, moment: float) -> int:
        return sum(1 for at in self.claimed_at if at > moment)

    def job_finished(self, job_type: str, outcome: str, handler_seconds: Any) -> None:
        pass

    def group_written(self, writer: str, size: int, seconds: float) -> None:
        pass

    def heartbeat_failed(self, job_type: str) -> None:
        pass


def lock_waiters(engine: Any) -> int:
    """How many sessions on this database wait for a lock (a heartbeat blocked on a row, say)."""
    return scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND wait_event_type = 'Lock'")


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds.

    The one way the tests wait for something to happen: never a fixed sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(interval)


def terminate_backend(engine: Any, pid: int) -> None:
    """End a server session, as a restart or an admin would, and wait until it is gone."""
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    wait_until(lambda: not scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid", pid=pid))


def run_worker_until(engine: Any, registry: Any, config: Any, condition: Callable[[], Any], timeout: float = 30) -> None:
    """Run a worker loop in a thread until ``condition`` holds, then shut it down and check it stopped."""
    shutdown = threading.Event()
    worker = threading.Thread(target=run_worker_loop, args=(engine, registry, config, shutdown), daemon=True)
    worker.start()
    try:
        wait_until(condition, timeout=timeout)
    finally:
        shutdown.set()
        worker.join(30)
    assert not worker.is_alive()


def write_successes(bind: Any, completions: Any, **limits: Any) -> list[Any]:
    """Write (lease, completion or None) pairs as successes through the one outcome call; its answers."""
    from runledger_sync.core.outcomes import Succeed
    from runledger_sync.core.types import JobCompletion
    from runledger_sync.store.attempt.outcomes import apply_transitions

    return apply_transitions(bind, [(lease, Succeed(completion or JobCompletion())) for lease, completion in completions],
                             **limits)


@contextlib.contextmanager
def configured_logging(**options: Any) -> Iterator[logging.Logger]:
    """``rl.configure_logging(**options)`` for the block; the package logger's handlers and level are put back after."""
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    handlers, level = list(logger.handlers), logger.level
    rl.configure_logging(**options)
    try:
        yield logger
    finally:
        for handler in set(logger.handlers) - set(handlers):
            logger.removeHandler(handler)
        logger.setLevel(level)
