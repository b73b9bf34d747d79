"""What every operator read and action shares: the job id check, the organization scope, the status parts."""

from __future__ import annotations

from typing import Any, Optional
from uuid import UUID

from sqlalchemy import Text, bindparam, literal_column
from sqlalchemy.dialects.postgresql import JSONB

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_queue

_q = job_queue.c

# The listing indexes leave LEASED rows out (db/schema.py), so a query reaches them
# only when its text proves status <> 'LEASED': each status is written into the
# SQL (they come from JobStatus, never from the caller), and a query over every
# status is split into parts that each name theirs.
_RESTING = _q.status != literal_column(f"'{JobStatus.LEASED.value}'", Text)


def check_job_id(job_id: Any) -> UUID:
    if isinstance(job_id, str):
        try:
            return UUID(job_id)
        except ValueError:
            pass
    if not isinstance(job_id, UUID):
        raise InvalidArgument("job_id", job_id, "a UUID")
    return job_id


def scoped(statement: Any, organization_id: Optional[str]) -> Any:
    if organization_id is None:
        return statement
    check.check_organization_id(organization_id)
    return statement.where(_q.organization_id == organization_id)


def status_is(status: JobStatus) -> Any:
    return _q.status == literal_column(f"'{status.value}'", Text)


def status_parts(status: Optional[JobStatus]) -> list[Any]:
    """WHERE clauses that together select ``status`` (None: every status), each served by one index."""
    if status is not None:
        return [status_is(status)]
    return [_RESTING, status_is(JobStatus.LEASED)]


def meta_contains(meta: Any) -> Any:
    """Jobs whose metadata holds every key of ``meta`` with its value: containment (``@>``), which
    idx_job_queue_meta (GIN, jsonb_path_ops) answers; ``meta`` is checked by the caller (a JobFilter)."""
    return _q.meta.contains(bindparam("meta_contains", dict(meta), type_=JSONB))
