"""Enqueue jobs: one or a batch, with idempotency keys, on an Engine or in the caller's transaction.

A batch is read and written in chunks of :data:`ENQUEUE_CHUNK_SIZE` specs, one
statement per chunk (:mod:`runledger_sync.store.enqueue.chunk`), so a batch of
any length costs one round trip per chunk and bounded memory.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterable, Iterator, Literal, Mapping, Optional, Sequence, Union
from uuid import UUID

from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.errors import EnqueueIdempotencyUnsupportedIsolation, InvalidArgument
from runledger_sync.core.records import JobRecord, JobSpec
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.core.states import JobStage
from runledger_sync.core.types import DEFAULT_EVENT_LOG, EventLog
from runledger_sync.store.binds import Bind
from runledger_sync.store.enqueue.chunk import prepare_chunk, write_chunk
from runledger_sync.store.transactions import owns_transaction, require_read_committed, run_in_transaction

#: Specs checked, serialized and written per statement. A longer batch is
#: written chunk by chunk, so the call holds one chunk's parameters and rows at
#: a time (bench/enqueue_memory.py measures it), at one round trip per chunk.
ENQUEUE_CHUNK_SIZE = 2_000


# -- the public API ------------------------------------------------------------


def enqueue(
    bind: Bind,
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
    """Add one job to the queue.

    Given an Engine the job is committed here. Given what your application holds
    inside its own transaction (a SQLAlchemy Connection, an ORM Session such as
    Flask-SQLAlchemy's ``db.session``, or a raw psycopg2 connection such as
    Django's ``connection.connection``) the job joins that transaction: it exists
    only if you commit, and nothing here commits or rolls it back. Unset values
    come from the job type's definition.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        payload: any JSON value (default ``{}``), or a pydantic model instance, stored as
            its ``model_dump(mode="json")`` once its class accepts that dump (a type's
            ``payload_model`` is checked by :meth:`JobRegistry.enqueue`).
        run_at: when the job may start (timezone-aware); or ``delay_seconds`` from now.
        idempotency_key: with the same key (per type and organization) the same
            request returns the existing job instead of adding another.
        queue: the queue to join instead of the job type's own (see ``registry.job(queue=)``).
        concurrency_key: jobs of one key run at most their queue's ``key_limit`` at a
            time (default 1: one after another, in claim order), across every worker.
        meta: text keys to text values kept with the job and read as ``ctx.meta`` (at
            most 32 keys, 4 KiB of JSON); not compared on an idempotent repeat.
        event_log: ``full`` writes the job's ENQUEUED event row; ``transitions`` (the
            default) does not, and :func:`runledger_sync.list_events` draws that entry
            from the job row. Pass your ``JobsConfig.event_log`` to keep one level.
        unique: :class:`runledger_sync.Unique`: while a job of the same type, organization and
            key (default: payload) is live, return it instead of adding another. False: not
            unique, whatever the type's default (``registry.job(unique=...)``); None: that default.
        debounce: :class:`runledger_sync.Debounce`: a waiting job of the same type, organization
            and key takes this payload and meta and starts ``delay`` from now (at the latest
            ``max_delay`` after its first enqueue); not with ``unique``, ``run_at``,
            ``delay_seconds`` or ``idempotency_key``.
        batch: the id of an OPEN batch (:func:`runledger_sync.open_batch`) the job joins,
            counted in its progress; read as ``ctx.batch_id``. Not with ``debounce``.

    Returns:
        The job row (the existing one for a repeated idempotent request or a unique
        duplicate), its ``disposition`` saying which: ``created``, ``existing`` or ``replaced``.

    Raises:
        InvalidArgument, InvalidJobType, InvalidPayload, InvalidMeta: bad arguments (an unknown
            ``event_log`` level included); nothing written.
        InvalidUnique, InvalidDebounce, InvalidCoordination: bad ``unique`` or ``debounce``
            options, or ones that cannot go together; nothing written.
        DefinitionNotFoundOrDisabled: the type is unknown or disabled.
        QueueNotFound: ``queue`` names no queue (``queue.not_found``).
        IdempotencyConflict: the key exists with a different request.
        BatchNotFound, BatchClosed: ``batch`` names no batch, or one not OPEN; nothing written.

    Example:
        ``job = rl.enqueue(engine, "email.send", {"to": "a@b.c"}, delay_seconds=30)``

        In your transaction: ``with engine.begin() as conn: conn.execute(...);
        rl.enqueue(conn, "email.send", {...})``; with Django,
        ``with transaction.atomic(): rl.enqueue(connection.connection, ...)``.
    """
    spec = JobSpec(
        job_type=job_type,
        payload={} if payload is None else payload,
        priority=priority,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        run_at=run_at,
        delay_seconds=delay_seconds,
        organization_id=organization_id,
        idempotency_key=idempotency_key,
        stage=stage,
        queue=queue,
        concurrency_key=concurrency_key,
        meta=meta,
        unique=unique,
        debounce=debounce,
        batch=batch,
    )
    check.check_int("max_payload_bytes", max_payload_bytes, check.MAX_PAYLOAD_BYTES_RANGE)
    # One spec is one chunk: straight to its statement, past the batch's reading in chunks.
    return _enqueue_one_chunk(bind, [spec], max_payload_bytes, event_log, ids_only=False)[0]


def enqueue_many(
    bind: Bind,
    specs: Iterable[JobSpec],
    *,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
) -> list[JobRecord]:
    """Add a batch of jobs; all are written or none.

    ``specs`` may be any iterable, a generator included: it is read, checked and
    written :data:`ENQUEUE_CHUNK_SIZE` specs at a time, one statement per chunk,
    so what the call holds besides the records it returns stays bounded. A batch
    of one chunk is one statement; a longer one is one transaction, or, in your
    transaction, a savepoint of it, so an error in a later chunk leaves nothing
    of the batch behind.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
        event_log: whether each job gets its ENQUEUED event row, as for :func:`enqueue`.

    Returns:
        One record per spec, in the order given. For a batch too large to hold
        every record, :func:`enqueue_many_ids` returns only the ids.

    Raises:
        RunledgerError: the same errors as :func:`enqueue`; any one of them rejects the batch.
        ConnectionFailed: also when the connection was lost mid-way through a
            batch of several chunks read from a one-shot iterator, which cannot
            be sent again (nothing was written).
    """
    return _enqueue_chunked(bind, specs, max_payload_bytes, event_log, ids_only=False)


def enqueue_many_ids(
    bind: Bind,
    specs: Iterable[JobSpec],
    *,
    max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
    event_log: EventLog | str = DEFAULT_EVENT_LOG,
) -> list[UUID]:
    """Add a batch of jobs like :func:`enqueue_many`, returning only their ids.

    A record holds the job's payload and about thirty fields; an id is a few
    dozen bytes. Use this to enqueue hundreds of thousands of jobs from a
    generator in flat memory.

    Returns:
        One job id per spec, in the order given (the existing job's for a
        repeated idempotent request).

    Example:
        ``ids = rl.enqueue_many_ids(engine, (rl.JobSpec("import.row", row) for row in reader))``
    """
    return _enqueue_chunked(bind, specs, max_payload_bytes, event_log, ids_only=True)


def _enqueue_chunked(bind: Bind, specs: Any, max_payload_bytes: int, event_log: Any, *, ids_only: bool) -> list[Any]:
    _check_spec_source(specs)
    check.check_int("max_payload_bytes", max_payload_bytes, check.MAX_PAYLOAD_BYTES_RANGE)
    iterator = iter(specs)
    first = _next_specs(iterator, 0)
    if not first:
        return []
    second = _next_specs(iterator, len(first))
    if not second:
        return _enqueue_one_chunk(bind, first, max_payload_bytes, event_log, ids_only=ids_only)

    owned = owns_transaction(bind)
    # A list can be read again when a lost connection makes the store retry the
    # transaction; a generator cannot, and was already read in part.
    replayable = isinstance(specs, Sequence)
    tries = 0

    def several(connection: Connection) -> list[Any]:
        nonlocal tries
        tries += 1
        chunks: Iterator[list[JobSpec]]
        if tries == 1:
            chunks = itertools.chain((first, second), _chunks(iterator, len(first) + len(second)))
        elif replayable:
            chunks = _chunks(iter(specs), 0)
        else:
            raise ConnectionFailed(
                "the connection was lost during a batch read from a one-shot iterator; nothing was written, "
                "and the specs cannot be read again: enqueue them again from their source"
            )
        result: list[Any] = []
        isolation_checked = False
        with _all_or_nothing(connection, owned):
            for specs_of_chunk in chunks:
                chunk = prepare_chunk(specs_of_chunk, max_payload_bytes, event_log)
                if chunk.keyed and not isolation_checked:
                    require_read_committed(connection, EnqueueIdempotencyUnsupportedIsolation, "idempotent enqueue")
                    isolation_checked = True
                result.extend(write_chunk(connection, chunk, ids_only=ids_only))
        return result

    return run_in_transaction(bind, several)


def _enqueue_one_chunk(
    bind: Bind, specs: list[JobSpec], max_payload_bytes: int, event_log: Any, *, ids_only: bool,
) -> list[Any]:
    """Write at most :data:`ENQUEUE_CHUNK_SIZE` specs in one statement.

    Its ids are drawn before the first try, so a try repeated after a lost
    connection cannot write twice.
    """
    chunk = prepare_chunk(specs, max_payload_bytes, event_log)
    tries = 0

    def one(connection: Connection) -> list[Any]:
        nonlocal tries
        tries += 1
        if chunk.keyed:
            require_read_committed(connection, EnqueueIdempotencyUnsupportedIsolation, "idempotent enqueue")
        return write_chunk(connection, chunk, ids_only=ids_only, retried=tries > 1)

    return run_in_transaction(bind, one, one_repeatable_write=True)


def _check_spec_source(specs: Any) -> None:
    # A str or a bare JobSpec is iterable or close to it; refuse them by name
    # instead of failing on an attribute deep in the batch.
    if isinstance(specs, (str, bytes, JobSpec)) or not hasattr(specs, "__iter__"):
        raise InvalidArgument("specs", type(specs).__name__, "an iterable of JobSpec")


def _next_specs(iterator: Iterator[Any], offset: int) -> list[JobSpec]:
    """The next chunk of specs (empty at the end), each checked to be a JobSpec."""
    specs = list(itertools.islice(iterator, ENQUEUE_CHUNK_SIZE))
    for index, spec in enumerate(specs, start=offset):
        if not isinstance(spec, JobSpec):
            raise InvalidArgument(f"specs[{index}]", type(spec).__name__, "a JobSpec")
    return specs


def _chunks(iterator: Iterator[Any], offset: int) -> Iterator[list[JobSpec]]:
    while True:
        specs = _next_specs(iterator, offset)
        if not specs:
            return
        offset += len(specs)
        yield specs


@contextmanager
def _all_or_nothing(connection: Connection, owned: bool) -> Iterator[None]:
    """Make several statements one unit: an error leaves nothing of them behind."""
    if owned:
        # The store's own transaction: run_in_transaction rolls it back on error.
        yield
        return
    if getattr(connection.connection.driver_connection, "autocommit", False):
        # A caller's psycopg connection in autocommit mode (Django outside atomic())
        # has no transaction to join; one statement was atomic by itself, several
        # need a transaction, which ends here as it would have.
        connection.exec_driver_sql("BEGIN")
        try:
            yield
        except BaseException:
            connection.exec_driver_sql("ROLLBACK")
            raise
        connection.exec_driver_sql("COMMIT")
        return
    # In the caller's transaction: a savepoint, so a refused chunk takes back the
    # earlier ones and leaves the caller's own work as it was.
    with connection.begin_nested():
        yield
