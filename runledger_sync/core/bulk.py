"""What an operator's action on many jobs is given and answers: the filter, the result, the audit record.

A :class:`JobFilter` chooses jobs by what an incident asks about (type, status,
queue, organization, metadata, the last error, when they were created); every
criterion given must hold. It is checked when it is made, so a bad filter is
refused before anything is counted or changed. The bulk actions
(:mod:`runledger_sync.store.admin.bulk`) answer a :class:`BulkResult` and record
a :class:`JobOperation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.bulk_errors import EmptyJobFilter, InvalidJobFilter, InvalidJobUpdate
from runledger_sync.core.evidence import MAX_ERROR_TYPE_CHARS, stored_type_name
from runledger_sync.core.flow import QUEUE_NAME_MAX_LENGTH
from runledger_sync.core.meta import meta_json
from runledger_sync.core.states import JobStatus

#: The most values one list criterion of a filter may hold.
MAX_FILTER_VALUES = 100
#: An operator's reason and actor, as stored with the operation.
REASON_MAX_LENGTH = 255
ACTOR_MAX_LENGTH = 255


def _texts(argument: str, values: Any, max_length: int) -> Optional[tuple[str, ...]]:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidJobFilter(argument, values, "a list of strings, or None")
    if not 1 <= len(values) <= MAX_FILTER_VALUES:
        raise InvalidJobFilter(argument, f"a list of {len(values)}", f"a list of 1 to {MAX_FILTER_VALUES} values, or None")
    return tuple(check.check_text(argument, value, max_length=max_length, error=InvalidJobFilter) for value in values)


def _statuses(values: Any) -> Optional[tuple[JobStatus, ...]]:
    if values is None:
        return None
    if isinstance(values, (str, JobStatus)):
        values = [values]
    names = _texts("statuses", [getattr(value, "value", value) for value in values], 32) or ()
    try:
        return tuple(dict.fromkeys(JobStatus(name.upper()) for name in names))
    except ValueError:
        raise InvalidJobFilter("statuses", list(names), f"statuses among {', '.join(s.value for s in JobStatus)}") from None


def _moment(argument: str, value: Any) -> Optional[datetime]:
    if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise InvalidJobFilter(argument, value, "a timezone-aware datetime, or None")
    return value


@dataclass(frozen=True)
class JobFilter:
    """Which jobs an operator's action or listing is about; every criterion given must hold.

    Args:
        job_types: jobs of any of these types.
        statuses: jobs in any of these statuses (``"PENDING"`` or ``rl.JobStatus.PENDING``).
            A bulk action acts only on the statuses its rule allows (cancel: PENDING and
            LEASED; retry and delete: SUCCEEDED, DEAD_LETTERED and CANCELED; update:
            PENDING); None means all of those.
        queues: jobs in any of these queues.
        organization_id: jobs of this organization.
        meta: jobs whose metadata holds every one of these keys with these values
            (containment: other keys may be there too).
        error_code: jobs whose last failure had this code (``last_error_code``).
        error_type: jobs whose current attempt raised this exception type
            (``myapp.billing.Declined``; a builtin's as ``KeyError``).
        created_after: jobs created at or after this time.
        created_before: jobs created before this time.

    Raises:
        InvalidJobFilter: a criterion is malformed (``job.invalid_filter``).
        InvalidMeta: ``meta`` is not a mapping of text keys to text values, as an enqueue's.

    Example:
        ``rl.JobFilter(job_types=["sync.account"], meta={"tenant": "acme"})``
    """

    job_types: Optional[Sequence[str]] = None
    statuses: Optional[Sequence[JobStatus | str]] = None
    queues: Optional[Sequence[str]] = None
    organization_id: Optional[str] = None
    meta: Optional[Mapping[str, str]] = None
    error_code: Optional[str] = None
    error_type: Optional[str] = None
    created_after: Optional[datetime] = None
    created_before: Optional[datetime] = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "job_types", _texts("job_types", self.job_types, check.JOB_TYPE_MAX_LENGTH))
        put(self, "statuses", _statuses(self.statuses))
        put(self, "queues", _texts("queues", self.queues, QUEUE_NAME_MAX_LENGTH))
        if self.organization_id is not None:
            check.check_text("organization_id", self.organization_id, max_length=check.ORGANIZATION_ID_MAX_LENGTH,
                             max_bytes=check.ORGANIZATION_ID_MAX_BYTES, error=InvalidJobFilter)
        if self.meta is not None:
            meta_json(self.meta)
            if not self.meta:
                # Every job's metadata contains {}: the criterion would choose nothing out.
                raise InvalidJobFilter("meta", {}, "at least one key, or None")
            put(self, "meta", dict(self.meta))
        if self.error_code is not None:
            check.check_text("error_code", self.error_code, max_length=check.FAILURE_CODE_MAX_LENGTH,
                             error=InvalidJobFilter)
        if self.error_type is not None:
            put(self, "error_type", stored_type_name(check.check_text(
                "error_type", self.error_type, max_length=MAX_ERROR_TYPE_CHARS, error=InvalidJobFilter)))
        after = _moment("created_after", self.created_after)
        before = _moment("created_before", self.created_before)
        if after is not None and before is not None and after >= before:
            raise InvalidJobFilter("created_before", before, f"later than created_after ({after.isoformat()})")

    @property
    def is_empty(self) -> bool:
        """Whether no criterion is given (the filter would choose every job)."""
        return all(value is None for value in vars(self).values())

    def require_criteria(self, action: str) -> None:
        """Refuse a filter that names nothing for ``action``: every job is never chosen by omission.

        Raises:
            EmptyJobFilter: no criterion is given.
        """
        if self.is_empty:
            raise EmptyJobFilter("filter", "an empty JobFilter",
                                 f"at least one criterion for {action} (to act on every job, name the statuses)")

    def to_json(self) -> dict[str, Any]:
        """The criteria given, as JSON values (what an operation records and the CLI prints)."""
        shown: dict[str, Any] = {}
        for name, value in vars(self).items():
            if value is None:
                continue
            if name == "statuses":
                value = [status.value for status in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            shown[name] = value
        return shown


@dataclass(frozen=True)
class JobUpdate:
    """What a bulk update sets on PENDING jobs: a new priority, a new time to run, or both."""

    priority: Optional[int] = None
    run_at: Optional[datetime] = None

    def __post_init__(self) -> None:
        if self.priority is None and self.run_at is None:
            raise InvalidJobUpdate("update", "nothing", "a priority, a run_at, or both")
        if self.priority is not None:
            low, high = check.PRIORITY_RANGE
            if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not low <= self.priority <= high:
                raise InvalidJobUpdate("priority", self.priority, f"an integer from {low} to {high}")
        if self.run_at is not None and (not isinstance(self.run_at, datetime) or self.run_at.utcoffset() is None):
            raise InvalidJobUpdate("run_at", self.run_at, "a timezone-aware datetime")

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {}
        if self.priority is not None:
            shown["priority"] = self.priority
        if self.run_at is not None:
            shown["run_at"] = self.run_at.isoformat()
        return shown


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did.

    Attributes:
        action: ``cancel``, ``retry``, ``delete`` or ``update``.
        matched: the jobs the filter matched when the action began, among the statuses
            the action applies to (a dry run's count).
        changed: the jobs changed (0 for a dry run). Fewer than ``matched`` when jobs
            moved on meanwhile (a job that finished before its cancel came) or a rule
            left them out (``skipped``).
        skipped: matched jobs a lifecycle rule leaves out, by the rule's code
            (``{"job.workflow_requeue_not_supported": 2}``).
        dry_run: whether this was a dry run (nothing changed, nothing recorded).
        operation_id: the operation's ``job_operations`` row; None for a dry run.
    """

    action: str
    matched: int
    changed: int
    skipped: Mapping[str, int] = field(default_factory=dict)
    dry_run: bool = False
    operation_id: Optional[UUID] = None


@dataclass(frozen=True)
class JobOperation:
    """One bulk action as ``job_operations`` records it: who, what, the filter, the counts, when.

    ``status`` is RUNNING while its batches run, and stays RUNNING with ``finished_at``
    None if the process running it stopped (``cursor`` says how far it got); then
    SUCCEEDED, or FAILED with ``error_code``.
    """

    id: UUID
    action: str
    actor: str
    reason: str
    filter: dict[str, Any]
    changes: dict[str, Any]
    status: str
    matched: int
    changed: int
    skipped: dict[str, int]
    cursor: Optional[dict[str, Any]]
    error_code: Optional[str]
    started_at: datetime
    updated_at: datetime
    finished_at: Optional[datetime]
