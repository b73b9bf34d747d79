"""Wait for one job to end: ``rl.wait_for_job``, woken by the notification its last write sends.

A job has ended when its status is terminal: SUCCEEDED, DEAD_LETTERED or
CANCELED. A failed attempt that is retried goes back to PENDING, so it has not
ended, and neither has a job waiting for its next run.

The waiter LISTENs on :data:`~runledger_sync.store.driver.ENDED_CHANNEL` before it first reads the
job, so an end that commits between the read and the wait is not missed. Every
write that ends jobs notifies that channel once, naming them; the waiter reads
the job again only when its id is named (or a notification names none). It
also reads it every :data:`LISTENING_POLL_SECONDS` whatever it hears, in case a
proxy left the LISTEN without delivery. Behind a transaction pooler (the engine's
pool mode, see :mod:`runledger_sync.db.pool_mode`), or when the LISTEN cannot
be set up, it polls: every :data:`FIRST_POLL_SECONDS` at first, doubling up to
:data:`MAX_POLL_SECONDS`.
"""

from __future__ import annotations

import math
import select
import time
from typing import Iterable, Optional
from uuid import UUID

import psycopg2
import psycopg2.extensions
from sqlalchemy.engine import Engine

from runledger_sync.core.errors import InvalidArgument, JobNotFound, JobWaitTimeout
from runledger_sync.core.records import JobRecord
from runledger_sync.logging import get_logger
from runledger_sync.store.driver import ENDED_CHANNEL, Driver, driver_for, ended_job_ids

log = get_logger(__name__)

#: How often a listening waiter reads the job even when no notification names it.
LISTENING_POLL_SECONDS = 1.0
#: A polling waiter's first pause; each later one doubles, up to :data:`MAX_POLL_SECONDS`.
FIRST_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 0.5


def wait_for_job(
    engine: Engine, job_id: UUID | str, timeout: float = 30.0, *, organization_id: Optional[str] = None,
) -> JobRecord:
    """Block until the job has ended, and return its final row.

    Returns at once when the job has already ended. Ended means SUCCEEDED,
    DEAD_LETTERED or CANCELED: a retry puts the job back to PENDING and the wait
    goes on. Its ``finished_at`` is the end by the database clock.

    Args:
        engine: The Engine to read (and LISTEN) with; the wait holds one
            connection of its own for a LISTEN, detached from the pool.
        job_id: The job to wait for.
        timeout: The most seconds to wait (0: look once).
        organization_id: Only a job of this organization is found.

    Returns:
        The job's record, read after it ended.

    Raises:
        JobWaitTimeout: The job had not ended after ``timeout`` seconds
            (``job.wait_timeout``); ``details["status"]`` is its last status seen.
        JobNotFound: No such job in the scope (``job.not_found``), or it was pruned meanwhile.
        InvalidArgument: ``timeout`` is not a finite number of seconds >= 0.

    Example::

        job = rl.enqueue(engine, "report.build", {"rows": 21})
        done = rl.wait_for_job(engine, job.id, timeout=30)
        if done.status is rl.JobStatus.SUCCEEDED:
            print(done.output)
    """
    check_timeout(timeout)
    deadline = time.monotonic() + timeout
    driver = driver_for(engine)
    listener = _listen(driver) if timeout > 0 else None
    try:
        return _wait(driver, job_id, organization_id, deadline, timeout, listener)
    finally:
        if listener is not None:
            driver.close_listener(listener)


def check_timeout(timeout: object) -> None:
    """Raise InvalidArgument unless ``timeout`` is a finite number of seconds >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0:
        raise InvalidArgument("timeout", timeout, "a finite number of seconds >= 0")


def found(job: Optional[JobRecord], job_id: UUID | str) -> JobRecord:
    """``job``, read for ``job_id``; it has ended when its ``status.is_terminal``.

    Raises:
        JobNotFound: ``job`` is None: there is no such job (any more) in the scope.
    """
    if job is None:
        raise JobNotFound(f"job {job_id} was not found", job_id=str(job_id))
    return job


def timed_out(job: JobRecord, timeout: float) -> JobWaitTimeout:
    """The error of a wait of ``timeout`` seconds that last saw ``job`` not ended."""
    return JobWaitTimeout(
        f"job {job.id} had not ended after {timeout:g} s; it is {job.status.value}",
        job_id=str(job.id), status=job.status.value, timeout_seconds=timeout,
    )


def _wait(
    driver: Driver, job_id: UUID | str, organization_id: Optional[str], deadline: float, timeout: float,
    listener: Optional[psycopg2.extensions.connection],
) -> JobRecord:
    pause = FIRST_POLL_SECONDS
    while True:
        job = found(driver.get_job(job_id, organization_id=organization_id), job_id)
        if job.status.is_terminal:
            return job
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out(job, timeout)
        if listener is not None and not listener.closed:
            if not _heard(driver, listener, str(job.id), min(remaining, LISTENING_POLL_SECONDS)):
                listener = None  # lost: poll from here on; the caller's finally closes it
                pause = FIRST_POLL_SECONDS
            continue
        time.sleep(min(remaining, pause))
        pause = min(MAX_POLL_SECONDS, pause * 2)


def _listen(driver: Driver) -> Optional[psycopg2.extensions.connection]:
    """A connection listening for ended jobs, or None to poll (shared sessions, a caller's transaction, or the LISTEN failed)."""
    if not driver.listens:
        return None
    try:
        return driver.open_listener((ENDED_CHANNEL,))
    except Exception as error:  # noqa: BLE001 - any failure means: poll; reading the job reports an outage
        log.debug("wait_for_job polls: LISTEN failed", extra={"error": str(error)})
        return None


def _heard(driver: Driver, listener: psycopg2.extensions.connection, job_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` for a notification naming ``job_id``; False when the listener was lost."""
    until = time.monotonic() + timeout
    try:
        while True:
            if _named(driver.read_notifications(listener), job_id):
                return True
            remaining = until - time.monotonic()
            if remaining <= 0:
                return True  # read the job anyway: the periodic look
            select.select([listener], [], [], remaining)
    except (OSError, ValueError, psycopg2.Error) as error:
        log.debug("wait_for_job polls: listener lost", extra={"error": str(error)})
        return False


def _named(payloads: dict[str, set[str]], job_id: str) -> bool:
    return names(payloads.get(ENDED_CHANNEL, ()), job_id)


def names(ended_payloads: Iterable[str], job_id: str) -> bool:
    """True when notifications of :data:`~runledger_sync.store.driver.ENDED_CHANNEL` with these payloads may mean ``job_id`` ended."""
    payloads = list(ended_payloads)
    if not payloads:
        return False
    ids = ended_job_ids(payloads)
    return ids is None or job_id in ids
