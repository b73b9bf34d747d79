"""Enqueue from asyncio apps (FastAPI, Starlette, aiohttp) in the app's own transaction.

Each call is the synchronous API's call, run on the caller's async connection:
the same validation, the same statements and the same error codes. The job
joins the caller's transaction: it exists only if the caller commits, and
nothing here commits or rolls back. The worker that runs the jobs stays
synchronous.

Accepted as ``bind``: a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``
(``postgresql+psycopg_async://`` or ``postgresql+asyncpg://``), or a psycopg 3
``AsyncConnection``; :func:`get_job` and :func:`wait_for_job` also take an
``AsyncEngine``. Needs SQLAlchemy's asyncio support (the ``aio`` extra).

Example::

    from runledger_sync import aio

    async with engine.begin() as conn:          # an AsyncEngine
        await conn.execute(orders.insert().values(...))
        job = await aio.enqueue(conn, "email.send", {"to": "a@b.c"})
    done = await aio.wait_for_job(engine, job.id, timeout=30)
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any, Iterable, Literal, Mapping, Optional, Union
from uuid import UUID

from runledger_sync.core.errors import MissingExtra

try:
    # SQLAlchemy's asyncio layer runs our sync calls in greenlets; without greenlet
    # it would fail only at the first call. The aio extra brings it.
    importlib.import_module("greenlet")
except ImportError:
    raise MissingExtra("aio", "greenlet") from None
from runledger_sync.store.aio_binds import run_joined, run_read
from runledger_sync.aio._wait import wait_for_job
from runledger_sync.core import validation as check
from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.records import JobRecord, JobSpec
from runledger_sync.core.states import JobStage
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.core.workflow import Workflow, WorkflowAppend, WorkflowRunRecord
from runledger_sync.store.admin import jobs as store_jobs
from runledger_sync.store.workflows import append as store_append
from runledger_sync.store.workflows import enqueue as store_workflows
from runledger_sync.store.enqueue import enqueue as store_enqueue

__all__ = ["append_workflow_steps", "enqueue", "enqueue_many", "enqueue_workflow", "get_job", "wait_for_job"]


async def enqueue(
    bind: Any,
    job_type: str,
    payload: Any = None,
    *,
    priority: Optional[int] = None,
    max_attempts: Optional[int] = None,
    timeout_seconds: Optional[int] = None,
    run_at: Optional[datetime] = None,
    delay_seconds: Optional[float] = None,
    organization_id: Optional[str] = None,
    idempotency_key: Optional[str] = None,
    stage: JobStage = JobStage.QUEUED,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    queue: Optional[str] = None,
    concurrency_key: Optional[str] = None,
    meta: Optional[Mapping[str, str]] = None,
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
    unique: Union[Unique, Literal[False], None] = None,
    debounce: Optional[Debounce] = None,
    batch: Optional[UUID | str] = None,
) -> JobRecord:
    """Add one job in the caller's transaction, as :func:`runledger_sync.enqueue` does.

    Every other argument is :func:`runledger_sync.enqueue`'s.

    Args:
        bind: a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``, or a psycopg 3
            ``AsyncConnection``, whose open transaction the call joins (the caller commits).

    Returns:
        The job row (the existing one for a repeated idempotent request).

    Raises:
        RunledgerError: the errors of :func:`runledger_sync.enqueue`, with the same codes.
        InvalidArgument: ``bind`` is of another kind (``job.invalid_argument``).
    """
    options: dict[str, Any] = dict(
        priority=priority, max_attempts=max_attempts, timeout_seconds=timeout_seconds, run_at=run_at,
        delay_seconds=delay_seconds, organization_id=organization_id, idempotency_key=idempotency_key, stage=stage,
        max_payload_bytes=max_payload_bytes, queue=queue, concurrency_key=concurrency_key, meta=meta,
        event_log=event_log, unique=unique, debounce=debounce, batch=batch,
    )
    return await run_joined(bind, lambda connection: store_enqueue.enqueue(connection, job_type, payload, **options))


async def enqueue_many(
    bind: Any, specs: Iterable[JobSpec], *, max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
) -> list[JobRecord]:
    """Add a batch of jobs in the caller's transaction; all are written or none (see :func:`runledger_sync.enqueue_many`).

    Returns:
        One record per spec, in the order given.
    """
    return await run_joined(bind, lambda connection: store_enqueue.enqueue_many(
        connection, specs, max_payload_bytes=max_payload_bytes, event_log=event_log))


async def enqueue_workflow(
    bind: Any, workflow: Workflow, *, max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG, batch: Optional[UUID | str] = None,
) -> WorkflowRunRecord:
    """Write a workflow run in the caller's transaction (see :func:`runledger_sync.enqueue_workflow`).

    Returns:
        The run with its steps.
    """
    return await run_joined(bind, lambda connection: store_workflows.enqueue_workflow(
        connection, workflow, max_payload_bytes=max_payload_bytes, event_log=event_log, batch=batch))


async def append_workflow_steps(
    bind: Any, run_id: UUID | str, more: WorkflowAppend, *, mutation_key: str,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
) -> WorkflowRunRecord:
    """Add steps to a running run at an open window in the caller's transaction (see
    :func:`runledger_sync.append_workflow_steps`); the same ``mutation_key`` again adds nothing.

    Returns:
        The run with its steps and its mutations.
    """
    return await run_joined(bind, lambda connection: store_append.append_workflow_steps(
        connection, run_id, more, mutation_key=mutation_key, max_payload_bytes=max_payload_bytes))


async def get_job(bind: Any, job_id: UUID | str, *, organization_id: Optional[str] = None) -> Optional[JobRecord]:
    """Return the job, or None when it does not exist in the scope (see :func:`runledger_sync.get_job`).

    Args:
        bind: an ``AsyncEngine`` (a transaction of its own, retried on a lost connection as
            :func:`runledger_sync.get_job` retries on an Engine), or a connection or
            session as for :func:`enqueue`, whose transaction the read joins (never retried).
    """
    return await run_read(bind, lambda connection: store_jobs.get_job(connection, job_id, organization_id=organization_id))
