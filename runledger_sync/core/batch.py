"""Batches: a group of jobs that ends once, with callbacks (``rl.open_batch``).

A batch is OPEN while members may be added (by any enqueue path, with
``batch=``, from a member's handler too), CLOSED once :func:`runledger_sync.close_batch`
says no more will come, and finished when it is closed and none of its members is
pending: SUCCEEDED when every member succeeded, else COMPLETED_WITH_ERRORS. The
callbacks are enqueued then, exactly once, in the transaction that finishes it:
``on_success`` only when it SUCCEEDED, ``on_complete`` whatever its members did.
A canceled batch enqueues none.

Each callback job's payload is the payload given, with ``"batch_id"`` added (the
batch's id as text), so a report can read :func:`runledger_sync.get_batch`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Optional
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.batch_errors import InvalidBatchCallback
from runledger_sync.core.payload_models import stored_payload

#: The key a callback job's payload carries its batch's id under.
CALLBACK_BATCH_ID_KEY = "batch_id"


class BatchStatus(str, enum.Enum):
    """Where a batch is (column ``job_batches.status``)."""

    #: Into: open_batch. Out: close_batch, cancel_batch.
    OPEN = "OPEN"
    #: Into: close_batch with members pending. Out: the last member's end, cancel_batch.
    CLOSED = "CLOSED"
    #: Into: the end that leaves a closed batch with no pending member, every member succeeded.
    SUCCEEDED = "SUCCEEDED"
    #: Into: the same end, some member dead-lettered or canceled.
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    #: Into: cancel_batch. Its members still pending were canceled; no callback is enqueued.
    CANCELED = "CANCELED"

    @property
    def is_finished(self) -> bool:
        """True once the batch takes no more members and will enqueue no callback."""
        return self in FINISHED_BATCH_STATUSES


FINISHED_BATCH_STATUSES = frozenset({BatchStatus.SUCCEEDED, BatchStatus.COMPLETED_WITH_ERRORS, BatchStatus.CANCELED})


@dataclass(frozen=True)
class BatchCallback:
    """A job to enqueue when a batch finishes: its type and payload (``batch_id`` is added to it)."""

    job_type: str
    payload: Mapping[str, Any] = field(default_factory=dict)


def check_callback(argument: str, value: Any, *, max_payload_bytes: int) -> Optional[tuple[BatchCallback, str]]:
    """``value`` (None, a ``(job_type, payload)`` pair or a :class:`BatchCallback`) checked, with its payload's JSON.

    Raises:
        InvalidBatchCallback: not such a pair, or its payload is not a JSON object.
        InvalidJobType, InvalidPayload: a bad job type, or a payload too large.
    """
    if value is None:
        return None
    if isinstance(value, BatchCallback):
        job_type, payload = value.job_type, value.payload
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        job_type, payload = value
    else:
        raise InvalidBatchCallback(f"{argument} must be a (job_type, payload) pair or None, got {type(value).__name__}")
    payload = {} if payload is None else stored_payload(payload)
    if not isinstance(payload, Mapping):
        raise InvalidBatchCallback(f"{argument}'s payload must be a JSON object, got {type(payload).__name__}")
    if CALLBACK_BATCH_ID_KEY in payload:
        raise InvalidBatchCallback(f"{argument}'s payload must not hold {CALLBACK_BATCH_ID_KEY!r}: the batch adds it")
    callback = BatchCallback(check.check_job_type(job_type), dict(payload))
    return callback, check.serialize_json(argument, callback.payload, max_bytes=max_payload_bytes)


@dataclass(frozen=True)
class BatchRecord:
    """One row of ``job_batches``: the batch, its counts and its callbacks.

    The counts are kept on the row as members are added and end, never counted
    from the members: ``total`` = ``pending`` + ``succeeded`` + ``failed`` + ``canceled``.
    """

    id: UUID
    status: BatchStatus
    #: Members added (an idempotent repeat or a unique duplicate adds none).
    total: int
    #: Members PENDING or LEASED (a retry waiting to run included).
    pending: int
    succeeded: int
    #: Members dead-lettered.
    failed: int
    canceled: int
    meta: Mapping[str, str]
    on_success: Optional[BatchCallback]
    on_complete: Optional[BatchCallback]
    #: The callback jobs enqueued when the batch finished; None before, or when not enqueued.
    on_success_job_id: Optional[UUID]
    on_complete_job_id: Optional[UUID]
    status_reason: Optional[str]
    created_at: datetime
    closed_at: Optional[datetime]
    finished_at: Optional[datetime]
    #: Of ``total``, the members that are workflow runs (each one member, whatever its steps).
    runs: int = 0

    @property
    def ended(self) -> int:
        """Members that ended, whatever their outcome."""
        return self.succeeded + self.failed + self.canceled


def with_batch_id(payload_json: str, batch_id: UUID) -> str:
    """A callback payload's JSON text (an object) with the batch's id added, as the finish trigger adds it to a clear one.

    A sealed payload is copied by the trigger as it is, so it is sealed with the id already in.
    """
    body = payload_json.rstrip()[:-1].rstrip()
    return f'{body}{"" if body.endswith("{") else ", "}"{CALLBACK_BATCH_ID_KEY}": "{batch_id}"}}'
