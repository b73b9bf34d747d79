"""An application for the multi-process tests: ``app="tests.process_app:registry"`` (or ``:make_registry``).

Each handler first records who ran it in ``process_runs`` (job id, attempt, worker
id, pid), so a test can see which worker process took which job. ``proc.block``
then waits for a row in ``process_gate`` before it succeeds, ignoring its
cancellation; ``proc.wait_cancel`` waits for its cancellation; ``proc.quick``
succeeds at once. The processes reach the database through
``PROCESS_APP_DATABASE_URL``, which the test sets before they start.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy
from sqlalchemy import text

import runledger_sync as rl

URL_VARIABLE = "PROCESS_APP_DATABASE_URL"
TABLES_DDL = (
    "CREATE TABLE IF NOT EXISTS process_runs (job_id uuid, attempt int, worker_id text, pid int)",
    "CREATE TABLE IF NOT EXISTS process_gate (opened boolean)",
)
#: A blocked handler gives up after this long, so a failed test cannot leave it running.
MAX_BLOCK_SECONDS = 30.0

_engines: dict[int, Any] = {}


def _engine() -> Any:
    # One engine per process: the handlers run in the spawned worker processes.
    if os.getpid() not in _engines:
        _engines[os.getpid()] = sqlalchemy.create_engine(
            rl.create_engine(os.environ[URL_VARIABLE]).url, poolclass=sqlalchemy.pool.NullPool
        )
    return _engines[os.getpid()]


def _record(ctx: rl.JobContext) -> None:
    with _engine().begin() as conn:
        conn.execute(text("INSERT INTO process_runs VALUES (:j, :a, :w, :p)"),
                     {"j": ctx.job_id, "a": ctx.attempt, "w": ctx.worker_id, "p": os.getpid()})


def make_registry() -> rl.JobRegistry:
    """The app as a factory, the form ``app="tests.process_app:make_registry"`` names."""
    made = rl.JobRegistry()

    @made.job("proc.block", max_attempts=3)
    def block(ctx: rl.JobContext, payload: dict) -> None:
        _record(ctx)
        deadline = time.monotonic() + MAX_BLOCK_SECONDS
        while time.monotonic() < deadline:
            with _engine().connect() as conn:
                if conn.execute(text("SELECT count(*) FROM process_gate")).scalar():
                    return
            time.sleep(0.02)
        raise rl.JobFailure.terminal("proc.never_released", "the test never opened the gate")

    @made.job("proc.wait_cancel", max_attempts=3)
    def wait_cancel(ctx: rl.JobContext, payload: dict) -> None:
        _record(ctx)
        ctx.wait_cancelled(MAX_BLOCK_SECONDS)
        ctx.check_cancelled()

    @made.job("proc.quick", max_attempts=3)
    def quick(ctx: rl.JobContext, payload: dict) -> None:
        _record(ctx)

    return made


registry = make_registry()


def refused_in_children() -> object:
    """A factory that gives the parent its registry but a worker process something else, so each child refuses."""
    import multiprocessing

    return registry if multiprocessing.parent_process() is None else "not a registry"
