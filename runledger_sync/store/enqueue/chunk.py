"""One chunk of an enqueue: validate and serialize its specs, write them in one statement.

Every chunk is one INSERT over ``unnest`` of bound arrays, so a thousand jobs
cost one round trip and the statement text never changes (the compiled cache
and the server's plan cache keep working). The same statement notifies idle
workers (:mod:`runledger_sync.store.notify`) when the transaction commits.
:mod:`runledger_sync.store.enqueue.enqueue` cuts a batch into chunks and decides the
transaction; this module knows one chunk.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import timezone
from decimal import Decimal
from typing import Any, Optional, Sequence, Union
from uuid import UUID

from sqlalchemy import (
    DateTime,
    Float,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    null,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert as pg_insert
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.payload_models import stored_payload
from runledger_sync.core.coordination import DEBOUNCE_STATES, Unique, given_coordination
from runledger_sync.core.coordination_errors import InvalidCoordination
from runledger_sync.core.encryption_errors import EncryptionKeyMissing
from runledger_sync.core.errors import (
    DefinitionNotFoundOrDisabled,
    IdempotencyConflict,
    IdempotencyConflictMissingExisting,
    InvalidArgument,
    LegacyIdempotencySnapshotMissing,
)
from runledger_sync.core.flow import check_optional_concurrency_key, check_optional_queue_name
from runledger_sync.core import instrumentation
from runledger_sync.core.encryption import DIGEST_FIELD, active_encryption, is_digest
from runledger_sync.core.ids import uuid7_strings
from runledger_sync.core.meta import meta_json
from runledger_sync.core.records import JobRecord, JobSpec
from runledger_sync.core.types import JobEventType
from runledger_sync.core.states import JobStage
from runledger_sync.db.schema import (
    UNIQUE_GLOBAL,
    UNIQUE_IN_ORGANIZATION,
    UNIQUE_LIVE,
    job_definitions,
    job_events,
    job_queue,
)
from runledger_sync.store.batches.members import check_batch_id, lock_open_batches
from runledger_sync.store.prepared import PreparedStatement
from runledger_sync.store.sealing import sealed
from runledger_sync.store.rows import DISPOSITION, JOB_COLUMNS, JOB_TEXT_COLUMNS, to_job, to_jobs
from runledger_sync.store.sql import event_log_params, full_event_log
from runledger_sync.store.notify import notify_due_types

# -- the batch statement -----------------------------------------------------

_INPUT = func.unnest(
    cast(bindparam("ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True))),
    bindparam("job_types", type_=ARRAY(Text)),
    bindparam("organization_ids", type_=ARRAY(Text)),
    cast(bindparam("payloads", type_=ARRAY(Text)), ARRAY(JSONB)),
    bindparam("priorities", type_=ARRAY(Integer)),
    bindparam("max_attempts", type_=ARRAY(Integer)),
    bindparam("timeouts", type_=ARRAY(Integer)),
    bindparam("run_ats", type_=ARRAY(DateTime(timezone=True))),
    bindparam("delays", type_=ARRAY(Float)),
    bindparam("stages", type_=ARRAY(Text)),
    bindparam("keys", type_=ARRAY(Text)),
    cast(bindparam("snapshots", type_=ARRAY(Text)), ARRAY(JSONB)),
    bindparam("queues", type_=ARRAY(Text)),
    bindparam("concurrency_keys", type_=ARRAY(Text)),
    cast(bindparam("metas", type_=ARRAY(Text)), ARRAY(JSONB)),
    bindparam("unique_keys", type_=ARRAY(Text)),
    bindparam("unique_periods", type_=ARRAY(Integer)),
    bindparam("unique_states", type_=ARRAY(Text)),
    bindparam("debounce_max_delays", type_=ARRAY(Float)),
    cast(bindparam("batch_ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True))),
).table_valued(
    "id", "job_type", "organization_id", "payload", "priority", "max_attempts", "timeout_seconds",
    "run_at", "delay_seconds", "stage", "idempotency_key", "enqueue_request", "queue", "execution_resource_key",
    "meta", "unique_key", "unique_period", "unique_states", "debounce_max_delay", "batch_id",
    with_ordinality="ord",
).render_derived(name="unnested")
#: The specs' rows, unnested once: the check that every type is enabled reads them too.
_SPECS = select(_INPUT).cte("input")


def _seconds_from_now(seconds: Any) -> Any:
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def unique_key_at_now(key: Any, period_seconds: Any) -> Any:
    """A unique key with its period's bucket, ``key@<bucket start, UTC>``, on the database's clock.

    now() is the transaction's start, so the enqueue and its read-back of a
    duplicate name the same bucket.
    """
    bucket = func.to_timestamp(func.floor(func.extract("epoch", func.now()) / period_seconds) * period_seconds)
    label = func.to_char(func.timezone("UTC", bucket), literal('YYYY-MM-DD"T"HH24:MI:SS"Z"'))
    return case((period_seconds.is_(None), key), else_=key + literal("@") + label)


#: What an enqueue did with a job, as ``JobRecord.disposition`` says.
CREATED, EXISTING, REPLACED = "created", "existing", "replaced"
#: The unique index of each organization side: its columns and predicate, which an
#: ``ON CONFLICT`` names to update the row it meets there.
_IN_ORGANIZATION = ((job_queue.c.job_type, job_queue.c.organization_id, job_queue.c.unique_key),
                    UNIQUE_IN_ORGANIZATION)
_GLOBAL = ((job_queue.c.job_type, job_queue.c.unique_key), UNIQUE_GLOBAL)


def _build_enqueue_statement(ids_only: bool = False, debounce_into: Optional[tuple[Any, str]] = None) -> Any:
    """The enqueue of a chunk; with ``debounce_into`` (a unique index) the enqueue of one
    debounced job, which updates the waiting job its insert meets in that index."""
    definition = job_definitions.alias("definition")
    enabled = and_(definition.c.job_type == _SPECS.c.job_type, definition.c.is_enabled)
    any_missing = exists(select(literal(1)).select_from(_SPECS.outerjoin(definition, enabled)).where(definition.c.job_type.is_(None)))
    rows = (
        select(
            _SPECS.c.id,
            _SPECS.c.job_type,
            _SPECS.c.organization_id,
            _SPECS.c.payload,
            func.coalesce(_SPECS.c.priority, definition.c.default_priority),
            func.coalesce(_SPECS.c.max_attempts, definition.c.max_attempts),
            func.coalesce(_SPECS.c.timeout_seconds, definition.c.default_timeout_seconds),
            func.coalesce(_SPECS.c.run_at, _seconds_from_now(func.coalesce(_SPECS.c.delay_seconds, 0.0))),
            _SPECS.c.stage,
            _SPECS.c.idempotency_key,
            _SPECS.c.enqueue_request,
            func.coalesce(_SPECS.c.queue, definition.c.queue),
            _SPECS.c.execution_resource_key,
            _SPECS.c.meta,
            unique_key_at_now(_SPECS.c.unique_key, _SPECS.c.unique_period),
            cast(_SPECS.c.unique_states, ARRAY(Text)),
            case((_SPECS.c.debounce_max_delay.is_(None), null()),
                 else_=_seconds_from_now(_SPECS.c.debounce_max_delay)),
            _SPECS.c.batch_id,
        )
        .select_from(_SPECS.join(definition, enabled))
        # All or nothing: one unknown or disabled type rejects the whole batch.
        .where(~any_missing)
        # Keyed rows lock their key as they go in (the key trigger): inserted in
        # key order, two batches naming the same keys take them in the same order
        # and wait for each other instead of deadlocking. Records are matched by id.
        .order_by(_SPECS.c.execution_resource_key.nulls_first(), _SPECS.c.ord)
    )
    insert = pg_insert(job_queue)
    written = insert.from_select(
        ["id", "job_type", "organization_id", "payload", "priority", "max_attempts", "timeout_seconds",
         "next_run_at", "stage", "idempotency_key", "enqueue_request", "queue", "execution_resource_key", "meta",
         "unique_key", "unique_states", "debounce_until", "batch_id"],
        rows,
    )
    if debounce_into is None:
        # Only the idempotency and unique indexes can conflict (ids are fresh
        # UUIDv7s); the skipped rows' holders are looked up afterwards.
        written = written.on_conflict_do_nothing()
        disposition: Any = literal(CREATED)
    else:
        # The waiting job of the key takes the newest payload and meta, and starts
        # after the delay, but no later than its cap. An update names one index:
        # the caller picks the one of the job's organization side.
        columns, where = debounce_into
        written = written.on_conflict_do_update(
            index_elements=list(columns),
            index_where=text(where),
            set_={
                "payload": insert.excluded.payload,
                "meta": insert.excluded.meta,
                "next_run_at": func.least(insert.excluded.next_run_at, job_queue.c.debounce_until),
                "debounce_count": job_queue.c.debounce_count + 1,
                "updated_at": func.now(),
            },
        )
    inserted = written.returning(*JOB_TEXT_COLUMNS).cte("inserted")
    if debounce_into is not None:
        disposition = case((inserted.c.debounce_count > 0, literal(REPLACED)), else_=literal(CREATED))
    event = (
        job_events.insert()
        .from_select(
            ["job_id", "run_number", "attempt", "event_type", "stage", "payload"],
            select(
                inserted.c.id,
                inserted.c.run_number,
                null(),
                literal(JobEventType.ENQUEUED.value),
                inserted.c.stage,
                func.jsonb_build_object("job_type", inserted.c.job_type),
            ).where(full_event_log(), inserted.c.debounce_count == 0),
        )
        .cte("enqueued_event")
    )
    # Delivered on commit only, so a rolled-back enqueue wakes no worker.
    notified = notify_due_types(inserted)
    returned = (inserted.c.id,) if ids_only else (*inserted.c, disposition.label(DISPOSITION))
    return select(*returned).add_cte(event).where(notified >= 0)


_ENQUEUE = PreparedStatement("enqueue", _build_enqueue_statement())
# For callers that want ids only: no row is sent back and decoded only to be dropped.
_ENQUEUE_IDS = PreparedStatement("enqueue_ids", _build_enqueue_statement(ids_only=True))
_DEBOUNCE_IN_ORGANIZATION = PreparedStatement("enqueue_debounce_org",
                                              _build_enqueue_statement(debounce_into=_IN_ORGANIZATION))
_DEBOUNCE_GLOBAL = PreparedStatement("enqueue_debounce_global", _build_enqueue_statement(debounce_into=_GLOBAL))

# A key's live holder, read through the unique index of the job's organization side;
# none when the type has no enabled definition, since then the insert could not have met it.
_ENABLED = exists(select(literal(1)).where(job_definitions.c.job_type == bindparam("job_type"),
                                           job_definitions.c.is_enabled))
_HOLDER = select(*JOB_COLUMNS).where(
    job_queue.c.job_type == bindparam("job_type"),
    job_queue.c.unique_key == unique_key_at_now(bindparam("unique_key", type_=Text),
                                                bindparam("unique_period", type_=Integer)),
    text(UNIQUE_LIVE),
    _ENABLED,
)
_HOLDER_IN_ORGANIZATION = _HOLDER.where(job_queue.c.organization_id == bindparam("organization_id", type_=Text))
_HOLDER_GLOBAL = _HOLDER.where(job_queue.c.organization_id.is_(None))

_KEYED = select(*JOB_COLUMNS).where(
    job_queue.c.job_type == bindparam("job_type"), job_queue.c.idempotency_key == bindparam("idempotency_key"),
)
# A key is unique among an organization's jobs of a type, or among those of no
# organization, each in a partial index of its own; a lookup reaches one only by a
# condition that names its side (IS NOT DISTINCT FROM names neither, and reads
# the whole table).
_EXISTING_IN_ORGANIZATION = _KEYED.where(
    job_queue.c.organization_id == bindparam("organization_id", type_=Text)).with_for_update()
_EXISTING_GLOBAL = _KEYED.where(job_queue.c.organization_id.is_(None)).with_for_update()


def _check_stage(value: Any) -> JobStage:
    try:
        return JobStage(value)
    except ValueError:
        raise InvalidArgument("stage", value, f"one of {', '.join(s.value for s in JobStage)}") from None


def _batch_parameters(
    specs: Sequence[JobSpec], max_payload_bytes: int,
) -> tuple[dict[str, Optional[list[Any]]], list[UUID]]:
    """Validate and serialize ``specs`` into the statement's column arrays; draw their ids."""
    columns: dict[str, list[Any]] = {
        name: []
        for name in ("ids", "job_types", "organization_ids", "payloads", "priorities", "max_attempts",
                     "timeouts", "run_ats", "delays", "stages", "keys", "snapshots", "queues", "concurrency_keys",
                     "metas", "unique_keys", "unique_periods", "unique_states", "debounce_max_delays", "batch_ids")
    }
    # One lock and one read of the random source for the whole chunk.
    id_strings = uuid7_strings(len(specs))
    encryption = active_encryption()
    for spec, id_string in zip(specs, id_strings, strict=True):
        payload_json = check.serialize_json("payload", stored_payload(spec.payload), max_bytes=max_payload_bytes)
        priority = check.check_optional_int("priority", spec.priority, check.PRIORITY_RANGE)
        max_attempts = check.check_optional_int("max_attempts", spec.max_attempts, check.MAX_ATTEMPTS_RANGE)
        timeout = check.check_optional_int("timeout_seconds", spec.timeout_seconds, check.TIMEOUT_SECONDS_RANGE)
        run_at = check.check_run_at(spec.run_at)
        delay = None if spec.delay_seconds is None else check.check_seconds("delay_seconds", spec.delay_seconds, check.DELAY_SECONDS_RANGE)
        if run_at is not None and delay is not None:
            raise InvalidArgument("delay_seconds", spec.delay_seconds, "None when run_at is given")
        key = check.check_optional_idempotency_key(spec.idempotency_key)
        stage = _check_stage(spec.stage)
        queue = check_optional_queue_name(spec.queue)
        concurrency_key = check_optional_concurrency_key(spec.concurrency_key)
        meta = meta_json(spec.meta)
        coordination = _NOT_COORDINATED
        if spec.unique is not None or spec.debounce is not None:
            coordination = _coordination(spec, run_at, delay, key)
            delay = coordination.delay_seconds
        columns["ids"].append(id_string)
        columns["job_types"].append(check.check_job_type(spec.job_type))
        columns["organization_ids"].append(check.check_optional_organization_id(spec.organization_id))
        columns["payloads"].append(payload_json)
        columns["priorities"].append(priority)
        columns["max_attempts"].append(max_attempts)
        columns["timeouts"].append(timeout)
        columns["run_ats"].append(run_at)
        columns["delays"].append(delay)
        columns["stages"].append(stage.value)
        columns["keys"].append(key)
        columns["queues"].append(queue)
        columns["concurrency_keys"].append(concurrency_key)
        columns["metas"].append(meta)
        columns["unique_keys"].append(coordination.key)
        columns["unique_periods"].append(coordination.period_seconds)
        columns["unique_states"].append(coordination.states)
        columns["debounce_max_delays"].append(coordination.max_delay_seconds)
        columns["batch_ids"].append(None if spec.batch is None else str(check_batch_id(spec.batch)))
        snapshot = None if key is None else request_snapshot(spec, payload_json=payload_json)
        # With keys, a repeat is compared by a keyed digest: the request holds the payload.
        columns["snapshots"].append(snapshot if encryption is None or snapshot is None else encryption.digest(snapshot))
    if encryption is not None:
        # The ids are the associated data: each payload opens only in its own row.
        columns["payloads"] = encryption.seal_many(columns["payloads"], id_strings)
    if instrumentation.enqueue_observers:
        # Once every spec of the chunk is valid, so no observer (a tracer) hears of a job never sent.
        columns["metas"] = [
            meta_json(instrumentation.observed_meta(spec.job_type, id_string, spec.meta))
            for spec, id_string in zip(specs, id_strings, strict=True)
        ]
    return _nulls_once(columns), [UUID(id_string) for id_string in id_strings]


#: The columns a spec may leave unset.
_OPTIONAL_COLUMNS = ("organization_ids", "priorities", "max_attempts", "timeouts", "run_ats", "delays", "keys",
                     "snapshots", "queues", "concurrency_keys", "unique_keys", "unique_periods", "unique_states",
                     "debounce_max_delays", "batch_ids")


def _nulls_once(columns: dict[str, list[Any]]) -> dict[str, Optional[list[Any]]]:
    """``columns`` with each optional column unset in every row sent as one NULL.

    An array of NULLs costs a bound NULL per row to render, send and parse; the
    statement's unnest pads a NULL array with NULLs to the other arrays' length.
    """
    sent: dict[str, Optional[list[Any]]] = dict(columns)
    for name in _OPTIONAL_COLUMNS:
        if all(value is None for value in columns[name]):
            sent[name] = None
    return sent


@dataclass(frozen=True)
class _Coordination:
    """A spec's unique or debounce options as the statement's columns."""

    key: Optional[str] = None
    period_seconds: Optional[int] = None
    #: An array literal, cast to text[] by the statement (unnest cannot take an array of arrays).
    states: Optional[str] = None
    max_delay_seconds: Optional[float] = None
    delay_seconds: Optional[float] = None


_NOT_COORDINATED = _Coordination()


def _coordination(spec: JobSpec, run_at: Any, delay: Optional[float], key: Optional[str]) -> _Coordination:
    if spec.unique is not None and spec.debounce is not None:
        raise InvalidCoordination("debounce", type(spec.debounce).__name__, "None when unique is given")
    # False was made None by prepare_chunk: here a unique is an rl.Unique.
    if isinstance(spec.unique, Unique):
        unique = spec.unique.checked()
        encryption = active_encryption()
        # With keys, a key made from the payload is a keyed digest: a plain hash of a small payload could be reversed.
        keyed_hash = None if encryption is None else encryption.keyed_hash
        return _Coordination(unique.base_key(stored_payload(spec.payload), keyed_hash), unique.period_seconds,
                             _array_literal(unique.states), None, delay)
    debounce = spec.debounce.checked()  # type: ignore[union-attr]
    # A debounce may update a job already waiting, which joined its own batch or none.
    if spec.batch is not None:
        raise InvalidCoordination("debounce", type(spec.debounce).__name__, "None when batch is given")
    # A debounce sets the start itself, and updates the job it meets, which an
    # idempotent request's read-back and comparison could not follow.
    if run_at is not None or delay is not None:
        raise InvalidCoordination("debounce", type(spec.debounce).__name__,
                                  "None when run_at or delay_seconds is given")
    if key is not None:
        raise InvalidCoordination("debounce", type(spec.debounce).__name__, "None when idempotency_key is given")
    return _Coordination(debounce.key, None, _array_literal(DEBOUNCE_STATES), debounce.max_delay_seconds,
                         debounce.delay_seconds)


def _array_literal(states: tuple[str, ...]) -> str:
    # Job statuses are upper-case words: nothing in them needs quoting.
    return "{" + ",".join(states) + "}"


def request_snapshot(spec: JobSpec, *, payload_json: str) -> str:
    """Return the canonical JSON of an enqueue request, compared on idempotent repeats.

    It holds what the caller asked for, not the defaults it resolved to, so a
    repeated request matches even after a definition's defaults change. The
    metadata is left out: a trace context or request id differs on every repeat.
    """
    run_at = None
    if spec.run_at is not None:
        run_at = spec.run_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    parts: dict[str, Any] = {
        "max_attempts": spec.max_attempts,
        "next_run_at": run_at,
        "payload": "__PAYLOAD__",
        "priority": spec.priority,
        "stage": JobStage(spec.stage).value,
        "timeout_seconds": spec.timeout_seconds,
    }
    if spec.delay_seconds is not None:
        parts["delay_seconds"] = float(spec.delay_seconds)
    # Only when given, so a request stored before queues existed still matches.
    if spec.queue is not None:
        parts["queue"] = spec.queue
    if spec.concurrency_key is not None:
        parts["concurrency_key"] = spec.concurrency_key
    # The payload is already canonical JSON text; splice it in rather than re-encode it.
    encoded = check.serialize_json("request", parts)
    return encoded.replace('"__PAYLOAD__"', payload_json, 1)


def _raise_if_definition_missing(connection: Connection, job_types: set[str]) -> None:
    enabled = set(
        connection.execute(
            select(job_definitions.c.job_type).where(
                job_definitions.c.job_type.in_(sorted(job_types)), job_definitions.c.is_enabled
            )
        ).scalars()
    )
    missing = sorted(job_types - enabled)
    if missing:
        raise DefinitionNotFoundOrDisabled(
            f"job type {missing[0]!r} has no enabled definition; register its handler and call "
            "registry.sync_definitions(engine), or enable it",
            job_types=missing,
        )


def same_request(stored: Any, snapshot: str) -> bool:
    # jsonb keeps a number's decimal value, not its float: 3.602879701896397e+16
    # comes back as the int 36028797018963970, which != the float it was. Compare
    # numbers as the decimals their JSON spelling denotes.
    return _as_decimals(stored) == _as_decimals(json.loads(snapshot, parse_float=Decimal, parse_int=Decimal))


def _same_request_of(spec: JobSpec, stored: Any, snapshot: str) -> bool:
    """Whether ``spec``'s request (``snapshot`` as the chunk sent it: clear, or its digest) matches the stored one."""
    if not is_digest(stored) and not snapshot.startswith('{"' + DIGEST_FIELD):
        return same_request(stored, snapshot)
    # A digest on either side: compare under the stored side's terms, from the clear request.
    clear = request_snapshot(spec, payload_json=check.serialize_json("payload", stored_payload(spec.payload)))
    if not is_digest(stored):
        return same_request(stored, clear)
    encryption = active_encryption()
    if encryption is None:
        raise EncryptionKeyMissing(f"encryption key {stored[DIGEST_FIELD][0]} missing",
                                   key_id=stored[DIGEST_FIELD][0])
    return encryption.same_digest(stored, clear)


def _as_decimals(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)):
        # Tagged, since Decimal(1) == True would make 1 and true the same request.
        return ("number", value if isinstance(value, Decimal) else Decimal(repr(value)))
    if isinstance(value, list):
        return [_as_decimals(item) for item in value]
    return {key: _as_decimals(item) for key, item in value.items()}


def _written_by_earlier_try(connection: Connection, job_ids: list[UUID]) -> dict[UUID, JobRecord]:
    # The ids were drawn before the first try, so a row that holds one is ours: a try
    # whose connection was lost after its statement committed wrote it.
    rows = connection.execute(select(*JOB_COLUMNS).where(job_queue.c.id.in_(job_ids)))
    return {row.id: dataclasses.replace(to_job(row), disposition=CREATED) for row in rows}


def _existing_for_key(
    connection: Connection, spec: JobSpec, snapshot: Optional[str], *, missing_ok: bool = False,
) -> Optional[JobRecord]:
    """The job holding ``spec``'s idempotency key, compared with its request; with ``missing_ok``
    None when no job holds it (a unique spec's insert may have met its unique key instead)."""
    if spec.idempotency_key is None:
        # Unkeyed rows cannot conflict, so a missing row means its definition vanished mid-batch.
        _raise_if_definition_missing(connection, {spec.job_type})
        raise IdempotencyConflictMissingExisting(f"job of type {spec.job_type!r} was not inserted")
    row = connection.execute(
        _EXISTING_GLOBAL if spec.organization_id is None else _EXISTING_IN_ORGANIZATION,
        {"job_type": spec.job_type, "idempotency_key": spec.idempotency_key, "organization_id": spec.organization_id},
    ).first()
    if row is None:
        if missing_ok:
            return None
        _raise_if_definition_missing(connection, {spec.job_type})
        raise IdempotencyConflictMissingExisting(
            f"idempotency key {spec.idempotency_key!r} conflicted but no existing job was found"
        )
    existing = to_job(row)
    if existing.enqueue_request is None:
        raise LegacyIdempotencySnapshotMissing(
            f"job {existing.id} holds key {spec.idempotency_key!r} but has no request snapshot to compare"
        )
    if snapshot is None or not _same_request_of(spec, existing.enqueue_request, snapshot):
        raise IdempotencyConflict(
            f"idempotency key {spec.idempotency_key!r} is taken by job {existing.id} with a different request",
            job_id=str(existing.id),
        )
    return existing


# -- one chunk -------------------------------------------------------------------


@dataclass
class Chunk:
    """Specs checked and serialized, with the ids drawn for them, ready to write."""

    specs: list[JobSpec]
    params: dict[str, Any]
    ids: list[UUID]

    @property
    def keyed(self) -> bool:
        """Whether a row may meet another in an index and have it read back by a later statement (READ COMMITTED).

        A debounce reads nothing back: its one statement updates the job it meets.
        """
        return self.params["keys"] is not None or any(spec.unique is not None for spec in self.specs)

    @property
    def snapshots(self) -> Sequence[Optional[str]]:
        """Each spec's request snapshot, None for a spec without an idempotency key."""
        return self.column("snapshots")

    def column(self, name: str) -> Sequence[Any]:
        """One parameter column, a value per spec (None for each when all were unset and sent as one NULL)."""
        values: Optional[list[Any]] = self.params[name]
        return [None] * len(self.specs) if values is None else values

    def part(self, indexes: list[int]) -> "Chunk":
        """The chunk of the specs at ``indexes`` only, with their ids (a column sent as one NULL stays one)."""
        params = {name: [value[i] for i in indexes] if isinstance(value, list) else value
                  for name, value in self.params.items()}
        return Chunk([self.specs[i] for i in indexes], params, [self.ids[i] for i in indexes])


def prepare_chunk(specs: list[JobSpec], max_payload_bytes: int, event_log: Any) -> Chunk:
    """Check and serialize ``specs`` for the ``event_log`` level; raise the first argument error, before anything is written."""
    specs = [_coordination_given(spec) for spec in specs]
    params, ids = _batch_parameters(specs, max_payload_bytes)
    return Chunk(specs, params | event_log_params(event_log), ids)


def _coordination_given(spec: JobSpec) -> JobSpec:
    """``spec`` with ``unique=False`` as None, so everything after reads ``unique is not None`` as "unique"."""
    if spec.unique is None and spec.debounce is None:
        return spec
    unique, _ = given_coordination(spec.unique, spec.debounce)
    return spec if unique is spec.unique else dataclasses.replace(spec, unique=unique)


def write_chunk(
    connection: Connection, chunk: Chunk, *, ids_only: bool = False, retried: bool = False,
) -> Union[list[JobRecord], list[UUID]]:
    """Write one chunk and return, in spec order, its records (or their ids).

    ``retried``: an earlier try of this chunk, with its ids, may have committed
    before its connection was lost (its rows are then this call's own).

    The chunk is one statement, and each debounced spec one more after it, in
    spec order (one update cannot meet the same row twice, and a later debounce
    of a key replaces what an earlier one wrote). Batches the specs join are
    locked first and must be OPEN (:func:`lock_open_batches`). A repeated idempotent request
    and a unique duplicate answer with the existing job, looked up here; any
    error leaves the caller's transaction to roll back.
    """
    batch_ids = chunk.params["batch_ids"]
    if batch_ids is not None:
        lock_open_batches(connection, {batch_id for batch_id in batch_ids if batch_id is not None})
    debounced = [i for i, spec in enumerate(chunk.specs) if spec.debounce is not None]
    if not debounced:
        return _write_rows(connection, chunk, ids_only, retried)
    result: list[Any] = [None] * len(chunk.ids)
    rest = [i for i, spec in enumerate(chunk.specs) if spec.debounce is None]
    if rest:
        for i, found in zip(rest, _write_rows(connection, chunk.part(rest), ids_only, retried), strict=True):
            result[i] = found
    for i in debounced:
        result[i] = _write_debounced(connection, chunk.part([i]), ids_only)
    return result


def _write_debounced(connection: Connection, one: Chunk, ids_only: bool) -> Any:
    spec = one.specs[0]
    statement = _DEBOUNCE_GLOBAL if spec.organization_id is None else _DEBOUNCE_IN_ORGANIZATION
    jobs = to_jobs(statement.execute(connection, one.params))
    if not jobs:
        # An insert that met a waiting job updated it, so no row means no enabled definition.
        _raise_if_definition_missing(connection, {spec.job_type})
        raise IdempotencyConflictMissingExisting(f"debounced job of type {spec.job_type!r} was not written")
    job = jobs[0]
    if job.id != one.ids[0] and active_encryption() is not None:
        job = _reseal_debounced(connection, job, spec)
    return job.id if ids_only else job


def _reseal_debounced(connection: Connection, job: JobRecord, spec: JobSpec) -> JobRecord:
    """Seal a debounce's payload again for the waiting job it replaced: it was sealed for the id drawn for a new row.

    The upsert holds the row's lock until the caller commits, so no claim reads the first seal.
    """
    payload_json = check.serialize_json("payload", stored_payload(spec.payload))
    connection.execute(
        job_queue.update().where(job_queue.c.id == job.id)
        .values(payload=cast(literal(sealed(payload_json, job.id), Text), JSONB)))
    return dataclasses.replace(job, payload=json.loads(payload_json))


#: Rounds of a unique spec whose live holder finished between its insert and the
#: read-back: each round inserts it again. A holder that finishes every time is a
#: key enqueued and run faster than one statement.
_UNIQUE_ROUNDS = 3


def _write_rows(connection: Connection, chunk: Chunk, ids_only: bool, retried: bool, rounds: int = 1) -> list[Any]:
    inserted: dict[UUID, Any]
    if ids_only:
        inserted = {job_id: job_id for (job_id,) in _ENQUEUE_IDS.execute(connection, chunk.params)}
    else:
        inserted = {job.id: job for job in to_jobs(_ENQUEUE.execute(connection, chunk.params))}
    if len(inserted) == len(chunk.ids):
        return [inserted[job_id] for job_id in chunk.ids]
    # A unique spec's read-back finds its own row while it holds its key (below), and
    # answers for its definition; after a retry, its row may have finished and left the
    # key (to no one, or to a newer job), and only its id still finds it.
    unkeyed_missing = [i for i, spec in zip(chunk.ids, chunk.specs, strict=True)
                       if i not in inserted and spec.idempotency_key is None and (spec.unique is None or retried)]
    if unkeyed_missing:
        inserted.update(
            (job_id, job_id if ids_only else record)
            for job_id, record in _written_by_earlier_try(connection, unkeyed_missing).items()
        )
    if not inserted and any(spec.unique is None for spec in chunk.specs):
        _raise_if_definition_missing(connection, {spec.job_type for spec in chunk.specs})
    result: list[Any] = []
    again: list[int] = []
    for index, (job_id, spec, snapshot) in enumerate(zip(chunk.ids, chunk.specs, chunk.snapshots, strict=True)):
        found = inserted.get(job_id)
        if found is None:
            # The idempotency key first: the same request gets its own job back, and
            # another one is refused, as without unique; then the unique key's holder.
            existing = None
            if spec.unique is None or spec.idempotency_key is not None:
                existing = _existing_for_key(connection, spec, snapshot, missing_ok=spec.unique is not None)
            if existing is None and spec.unique is not None:
                existing = _live_holder(connection, spec, chunk, index)
            if existing is None:
                again.append(index)
            elif existing.id == job_id:
                # Written by an earlier try whose connection was lost after its commit.
                found = existing.id if ids_only else dataclasses.replace(existing, disposition=CREATED)
            else:
                found = existing.id if ids_only else dataclasses.replace(existing, disposition=EXISTING)
        result.append(found)
    if again:
        _raise_if_definition_missing(connection, {chunk.specs[index].job_type for index in again})
        if rounds >= _UNIQUE_ROUNDS:
            raise IdempotencyConflictMissingExisting(
                f"unique key {chunk.column('unique_keys')[again[0]]!r} conflicted but its holder finished "
                f"{rounds} times before it could be read")
        again_rows = _write_rows(connection, chunk.part(again), ids_only, retried, rounds + 1)
        for index, found in zip(again, again_rows, strict=True):
            result[index] = found
    return result


def _live_holder(connection: Connection, spec: JobSpec, chunk: Chunk, index: int) -> Optional[JobRecord]:
    """The job holding a unique spec's key now, read through its index, or None once it left its states.

    No row lock: the holder may be running, and its outcome write must not wait for the caller's commit.
    """
    row = connection.execute(
        _HOLDER_GLOBAL if spec.organization_id is None else _HOLDER_IN_ORGANIZATION,
        {"job_type": spec.job_type, "organization_id": spec.organization_id,
         "unique_key": chunk.column("unique_keys")[index], "unique_period": chunk.column("unique_periods")[index]},
    ).first()
    return None if row is None else to_job(row)


