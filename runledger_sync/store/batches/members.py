"""What an enqueue of batch members checks first: every batch it names exists and is OPEN.

The members' counts are the schema's triggers' (:mod:`runledger_sync.db.schema_batches`);
this check only refuses, with a coded error and before anything is written, what
the insert's trigger would otherwise refuse by aborting the caller's transaction.
"""

from __future__ import annotations

from typing import Any, Iterable
from uuid import UUID

from sqlalchemy import any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core.batch import BatchStatus
from runledger_sync.core.batch_errors import BatchClosed, BatchNotFound
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.db.schema_batches import job_batches

_b = job_batches.c
# Locked in id order, so two enqueues naming the same batches take them in the same
# order. FOR NO KEY UPDATE holds off a close or a cancel until the members commit
# (or roll back); the members' foreign key checks take KEY SHARE, which it allows.
_LOCK_BATCHES = (
    select(_b.id, _b.status)
    .where(_b.id == any_(bindparam("batch_ids", type_=ARRAY(PG_UUID(as_uuid=True)))))
    .order_by(_b.id)
    .with_for_update(key_share=True)
)


def check_batch_id(batch_id: Any, argument: str = "batch") -> UUID:
    """``batch_id`` (a UUID or its text) as a UUID.

    Raises:
        InvalidArgument: anything else.
    """
    if isinstance(batch_id, str):
        try:
            return UUID(batch_id)
        except ValueError:
            pass
    if not isinstance(batch_id, UUID):
        raise InvalidArgument(argument, batch_id, "a batch id (a UUID)")
    return batch_id


def lock_open_batches(connection: Connection, batch_ids: Iterable[Any]) -> None:
    """Lock the batches ``batch_ids`` names until the transaction ends; raise unless each is OPEN.

    Raises:
        BatchNotFound: a batch does not exist (``batch.not_found``).
        BatchClosed: a batch is closed, finished or canceled (``batch.closed``).
    """
    wanted = sorted({check_batch_id(batch_id) for batch_id in batch_ids})
    if not wanted:
        return
    found = dict(connection.execute(_LOCK_BATCHES, {"batch_ids": wanted}).all())
    for batch_id in wanted:
        status = found.get(batch_id)
        if status is None:
            raise BatchNotFound(f"batch {batch_id} was not found", batch_id=str(batch_id))
        if status != BatchStatus.OPEN.value:
            raise BatchClosed(f"batch {batch_id} is {status} and takes no more members",
                              batch_id=str(batch_id), status=status)
