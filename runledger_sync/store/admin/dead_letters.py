"""Dead letters chosen by a filter: list them, count the ones still dead, replay those in batches.

One filter serves all three (job type, organization, error code, the failing
exception's type, failed since), so what the dashboard and the CLI count is what
they replay. Every value is bound; the error type is matched on the failing
attempt's ``job_attempts.error_type`` (revision 0006), a builtin's given either
way (``builtins.KeyError`` or ``KeyError``, as it is stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.evidence import MAX_ERROR_TYPE_CHARS, stored_type_name
from runledger_sync.core.records import DeadLetterRecord
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_queue
from runledger_sync.store.admin.actions import REQUEUE_PICKABLE, requeue_statement
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.rows import DEAD_LETTER_COLUMNS, DEAD_LETTERS, to_dead_letter
from runledger_sync.store.scope import status_is

DEFAULT_LIST_LIMIT = 100
#: Jobs requeued per transaction by :func:`replay_dead_letters`.
DEFAULT_REPLAY_BATCH = 500
REPLAY_BATCH_RANGE = (1, 10_000)
#: The reason a replayed job's row and REQUEUED event carry.
REPLAY_REASON = "DEAD_LETTER_REPLAY"

_dl = job_dead_letters.c
_q = job_queue.c
#: Dead letters joined to their jobs: a dead-letter row outlives a replay, the job's status tells.
_WITH_JOBS = DEAD_LETTERS.join(job_queue, _q.id == _dl.job_id)


@dataclass(frozen=True)
class _Filter:
    job_type: Optional[str]
    organization_id: Optional[str]
    error_code: Optional[str]
    error_type: Optional[str]
    since: Optional[datetime]

    def conditions(self) -> list[Any]:
        conditions = []
        if self.job_type is not None:
            conditions.append(_dl.job_type == check.check_job_type(self.job_type))
        if self.organization_id is not None:
            conditions.append(_dl.organization_id == check.check_organization_id(self.organization_id))
        if self.error_code is not None:
            conditions.append(_dl.error_code == check.check_text(
                "error_code", self.error_code, max_length=check.FAILURE_CODE_MAX_LENGTH))
        if self.error_type is not None:
            conditions.append(job_attempts.c.error_type == stored_type_name(check.check_text(
                "error_type", self.error_type, max_length=MAX_ERROR_TYPE_CHARS)))
        if self.since is not None:
            conditions.append(_dl.failed_at >= check.check_run_at(self.since, "since"))
        return conditions

    def replayable(self) -> list[Any]:
        """The filter, narrowed to the jobs still dead-lettered that a requeue may pick."""
        return [*self.conditions(), status_is(JobStatus.DEAD_LETTERED), *REQUEUE_PICKABLE]


def list_dead_letters(
    bind: Bind,
    *,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    error_code: Optional[str] = None,
    error_type: Optional[str] = None,
    since: Optional[datetime] = None,
    limit: int = DEFAULT_LIST_LIMIT,
) -> list[DeadLetterRecord]:
    """Return dead letters, most recent failure first, each with its failing exception's type and traceback.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        error_code: only dead letters with this error code.
        error_type: only those whose failing attempt raised this exception type (its
            qualified name, as ``error_type`` shows it: ``myapp.billing.Declined``, a
            builtin's alone, ``ValueError``, or as ``builtins.ValueError``).
        since: only those that failed at or after this time.

    Raises:
        InvalidArgument: a filter is malformed.
    """
    check.check_int("limit", limit, check.LIMIT_RANGE)
    chosen = _Filter(job_type, organization_id, error_code, error_type, since)
    statement = (select(*DEAD_LETTER_COLUMNS).select_from(DEAD_LETTERS).where(*chosen.conditions())
                 .order_by(_dl.failed_at.desc()).limit(limit))
    rows = run_in_transaction(bind, lambda connection: connection.execute(statement).all())
    return [to_dead_letter(row) for row in rows]


def count_dead_letters(
    bind: Bind,
    *,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    error_code: Optional[str] = None,
    error_type: Optional[str] = None,
    since: Optional[datetime] = None,
    at_most: Optional[int] = None,
) -> int:
    """Return how many jobs :func:`replay_dead_letters` would requeue with the same filter.

    Those are the matching jobs still DEAD_LETTERED (a replayed job keeps its
    dead-letter row) and outside any workflow (a workflow's job is never requeued
    on its own). The filter arguments are those of :func:`list_dead_letters`.

    Args:
        at_most: stop counting there (a page that says "more than N" need not read
            every dead letter of a large table); None counts them all.
    """
    chosen = _Filter(job_type, organization_id, error_code, error_type, since)
    check.check_optional_int("at_most", at_most, (1, check.BIGINT_MAX))
    matching = select(_dl.job_id).select_from(_WITH_JOBS).where(*chosen.replayable())
    if at_most is not None:
        matching = matching.limit(at_most)
    statement = select(func.count()).select_from(matching.subquery("matching"))
    return int(run_in_transaction(bind, lambda connection: connection.execute(statement).scalar_one()))


def replay_dead_letters(
    bind: Bind,
    *,
    job_type: Optional[str] = None,
    organization_id: Optional[str] = None,
    error_code: Optional[str] = None,
    error_type: Optional[str] = None,
    since: Optional[datetime] = None,
    batch_size: int = DEFAULT_REPLAY_BATCH,
    limit: Optional[int] = None,
    reason: str = REPLAY_REASON,
) -> int:
    """Requeue every dead-lettered job the filter matches, most recent failure first, a batch per transaction.

    Each job starts a new run (run_number + 1) from attempt 0, as with
    :func:`runledger_sync.requeue_job`, with ``reason`` as its status reason and in
    its REQUEUED event. Two replays at once requeue each job once, counted by
    whichever got it (one may stop early, finding what is left taken by the other);
    a workflow's job is left alone. The filter arguments are
    those of :func:`list_dead_letters`.

    Args:
        bind: an Engine (each batch committed on its own), or a Connection, ORM Session
            or psycopg (2 or 3) connection whose open transaction every batch joins.
        batch_size: jobs requeued per transaction (1 to 10,000).
        limit: the most jobs requeued in all; None for every matching job.

    Returns:
        How many jobs were requeued.

    Raises:
        InvalidArgument: a filter, ``batch_size``, ``limit`` or ``reason`` is malformed.

    Example:
        ``rl.replay_dead_letters(engine, error_code="http.timeout", error_type="TimeoutError")``
    """
    chosen = _Filter(job_type, organization_id, error_code, error_type, since)
    conditions = chosen.replayable()
    check.check_int("batch_size", batch_size, REPLAY_BATCH_RANGE)
    check.check_optional_int("limit", limit, (1, check.BIGINT_MAX))
    check.check_text("reason", reason, max_length=255)
    replayed = 0
    while limit is None or replayed < limit:
        size = batch_size if limit is None else min(batch_size, limit - replayed)
        # FOR UPDATE OF the jobs alone: a row another replay holds is waited for, then
        # read again, and left out if that replay requeued it.
        picked = (select(_q.id, _q.run_number, _q.attempt).select_from(_WITH_JOBS).where(*conditions)
                  .order_by(_dl.failed_at.desc()).limit(size).with_for_update(of=job_queue))
        statement = requeue_statement(picked)

        def batch(connection: Connection, statement: Any = statement) -> int:
            return len(connection.execute(statement, {"reason": reason}).all())

        done = run_in_transaction(bind, batch)
        replayed += done
        if done == 0:
            break
    return replayed
