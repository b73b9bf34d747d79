"""Re-encrypt stored values under the current key, in short batches beside live traffic.

Each batch is one short transaction: it locks up to ``batch_size`` rows that
still hold a clear value or one under an old key (``FOR UPDATE SKIP LOCKED``,
so a row a worker is writing is passed over, and a claim passes over the
batch's rows for the few milliseconds it holds them), opens and seals their
values in Python, and writes them back by id. The lock makes the read and
the write one step: a worker's checkpoint or outcome write to the same row
waits for the batch and then applies on top of it, so nothing written
meanwhile is lost. The walk follows the primary key, so no batch reads the
table from the start again; rows passed over because they were locked are
taken on a later walk.

A clear idempotency snapshot becomes its keyed digest. A digest under an old
key stays as it is (a digest cannot be re-keyed): keep that key while a repeat
of such a request may still come.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from uuid import UUID

from sqlalchemy import Text, and_, bindparam, cast, func, literal, not_, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.engine import Connection, Engine

from runledger_sync.core import validation as check
from runledger_sync.core.encryption import DIGEST_FIELD, SEALED_FIELD, SEALED_PREFIX, Encryption, active_encryption
from runledger_sync.core.encryption_errors import EncryptionKeyMissing
from runledger_sync.core.batch import with_batch_id
from runledger_sync.db.schema import job_dead_letters, job_queue
from runledger_sync.db.schema_schedules import job_schedules
from runledger_sync.db.schema_batches import job_batches
from runledger_sync.db.schema_workflows import workflow_runs, workflow_steps
from runledger_sync.store.transactions import run_in_transaction

DEFAULT_ROTATION_BATCH_SIZE = 1000
#: Walks that find rows but could take none of them (all locked) before giving up.
_LOCKED_WALKS = 20


@dataclass(frozen=True)
class _Target:
    """A table's sealed and digested columns, and the id its values are bound to."""

    table: Any
    key: Any
    sealed: tuple[str, ...]
    digested: tuple[str, ...] = ()
    #: A sealed column bound to another id column than ``key`` (a batch's callbacks: their job ids).
    bound_to: tuple[tuple[str, str], ...] = ()
    #: How a clear value of a row becomes the text sealed (a callback's takes its batch id first).
    clear_text: Optional[Callable[[str, Any], str]] = None

    def row_id(self, row: Any, name: str) -> UUID:
        """The id a column's value is bound to: the row's own, or the one named in ``bound_to``."""
        bound: UUID = getattr(row, dict(self.bound_to).get(name, "row_id"))
        return bound

    def resealed(self, encryption: Encryption, row: Any, name: str) -> Optional[str]:
        text: Optional[str] = getattr(row, name)
        if self.clear_text is not None and text is not None and text != "null" and not text.startswith(SEALED_PREFIX):
            text = self.clear_text(text, row)
        return _reseal(encryption, text, self.row_id(row, name))


_TARGETS = (
    _Target(job_queue, job_queue.c.id, ("payload", "checkpoint", "output"), ("enqueue_request",)),
    _Target(job_dead_letters, job_dead_letters.c.job_id, ("payload_snapshot", "checkpoint_snapshot")),
    # A step's payload (and an external step's answer) is bound to the step's id, which its job takes when released.
    _Target(workflow_steps, workflow_steps.c.id, ("payload", "output")),
    _Target(workflow_runs, workflow_runs.c.id, (), ("enqueue_request",)),
    # A batch's callback payloads are bound to their jobs' ids (drawn at open): the finish trigger copies them there.
    _Target(job_batches, job_batches.c.id, ("on_success_payload", "on_complete_payload"),
            bound_to=(("on_success_payload", "on_success_job_id"), ("on_complete_payload", "on_complete_job_id")),
            clear_text=lambda text, row: with_batch_id(text, row.row_id)),
    # A schedule's payload template is bound to the schedule's id.
    _Target(job_schedules, job_schedules.c.id, ("payload_template",)),
)


def _stale(column: Any) -> Any:
    """A sealable value not sealed under the current key (clear, or under an old key)."""
    key_id = func.jsonb_extract_path_text(column, literal(SEALED_FIELD), literal("0"))
    return and_(column.is_not(None), column != cast(literal("null"), JSONB),
                key_id.is_distinct_from(bindparam("current_key", type_=Text)))


def _undigested(column: Any) -> Any:
    return and_(column.is_not(None), not_(column.has_key(DIGEST_FIELD)))


def _batch_statement(target: _Target) -> Any:
    table = target.table
    stale = or_(*(_stale(table.c[name]) for name in target.sealed),
                *(_undigested(table.c[name]) for name in target.digested))
    columns = [cast(table.c[name], Text).label(name) for name in (*target.sealed, *target.digested)]
    bound = [table.c[id_name] for _, id_name in target.bound_to]
    return (
        select(target.key.label("row_id"), *columns, *bound)
        .where(target.key > bindparam("after", type_=PG_UUID(as_uuid=True)), stale)
        .order_by(target.key)
        .limit(bindparam("batch_size"))
        .with_for_update(of=table, skip_locked=True)
    )


def _update_statement(target: _Target) -> Any:
    names = (*target.sealed, *target.digested)
    rows = func.unnest(
        cast(bindparam("row_ids", type_=ARRAY(Text)), ARRAY(PG_UUID(as_uuid=True))),
        *(bindparam(f"new_{name}", type_=ARRAY(Text)) for name in names),
    ).table_valued("row_id", *names).render_derived(name="rotated")
    return (
        target.table.update()
        .where(target.key == rows.c.row_id)
        .values({name: cast(rows.c[name], JSONB) for name in names})
    )


_STATEMENTS = {target.table.name: (_batch_statement(target), _update_statement(target)) for target in _TARGETS}
_NOTHING = UUID(int=0)


def rotate_encryption(engine: Engine, *, batch_size: int = DEFAULT_ROTATION_BATCH_SIZE) -> int:
    """Re-encrypt every stored value under the current key; return how many rows were rewritten.

    Clear values (written before keys were configured) are sealed, values under
    an old key are sealed again under the current one, and clear idempotency
    snapshots become keyed digests. It runs beside workers and enqueues: each
    batch is one short transaction that skips rows locked by others, and a row
    passed over is taken on a later walk. Run it again at any time: a row
    already under the current key is not touched.

    Example:
        ``rl.configure_encryption(rl.Encryption.from_env()); rl.rotate_encryption(engine)``

    Args:
        engine: the queue database (each batch commits on its own).
        batch_size: rows per batch (1-10,000).

    Raises:
        EncryptionKeyMissing: no keys are configured, or a row is sealed under a key
            this process does not hold (the rows before it stay rewritten).
    """
    check.check_int("batch_size", batch_size, (1, 10_000))
    encryption = active_encryption()
    if encryption is None:
        raise EncryptionKeyMissing("rotate_encryption needs keys: call configure_encryption first")
    rewritten = 0
    for target in _TARGETS:
        rewritten += _rotate_table(engine, encryption, target, batch_size)
    return rewritten


def _rotate_table(engine: Engine, encryption: Encryption, target: _Target, batch_size: int) -> int:
    rewritten = 0
    locked_walks = 0
    while True:
        walked, found = _walk(engine, encryption, target, batch_size)
        rewritten += walked
        if walked == 0 and not found:
            return rewritten
        if walked == 0:
            # Every row left was locked by a writer: wait for those short transactions.
            locked_walks += 1
            if locked_walks > _LOCKED_WALKS:
                return rewritten
            time.sleep(0.05)


def _walk(engine: Engine, encryption: Encryption, target: _Target, batch_size: int) -> tuple[int, bool]:
    """One walk over the table by id; the rows it rewrote, and whether any stale row is left."""
    batch, update = _STATEMENTS[target.table.name]
    last: Optional[UUID] = _NOTHING
    rewritten = 0
    while last is not None:
        done, last = run_in_transaction(engine, functools.partial(
            _one_batch, encryption=encryption, target=target, batch=batch, update=update, after=last,
            batch_size=batch_size))
        rewritten += done
    left = run_in_transaction(engine, lambda connection: connection.execute(
        select(literal(1)).select_from(target.table).where(
            or_(*(_stale(target.table.c[name]) for name in target.sealed),
                *(_undigested(target.table.c[name]) for name in target.digested))).limit(1),
        {"current_key": encryption.current}).first() is not None)
    return rewritten, left


def _one_batch(connection: Connection, encryption: Encryption, target: _Target, batch: Any, update: Any,
               after: UUID, batch_size: int) -> tuple[int, Optional[UUID]]:
    rows = connection.execute(batch, {"after": after, "batch_size": batch_size,
                                      "current_key": encryption.current}).all()
    if not rows:
        return 0, None
    params: dict[str, Any] = {"row_ids": [str(row.row_id) for row in rows]}
    for name in target.sealed:
        params[f"new_{name}"] = [target.resealed(encryption, row, name) for row in rows]
    for name in target.digested:
        params[f"new_{name}"] = [_digested(encryption, getattr(row, name)) for row in rows]
    connection.execute(update, params)
    last = rows[-1].row_id
    return len(rows), (last if len(rows) == batch_size else None)


def _reseal(encryption: Encryption, text: Optional[str], row_id: UUID) -> Optional[str]:
    if text is None or text == "null":
        return text
    if text.startswith(SEALED_PREFIX):
        if json.loads(text)[SEALED_FIELD][0] == encryption.current:
            return text
        text = encryption.open(text, row_id)
    return encryption.seal(text, row_id)


def _digested(encryption: Encryption, text: Optional[str]) -> Optional[str]:
    if text is None or text.startswith('{"' + DIGEST_FIELD):
        return text
    return encryption.digest(text)


def stale_counts(engine: Engine) -> dict[str, int]:
    """How many rows of each table still hold a clear value or one under another key than the current one."""
    encryption = active_encryption()
    current = None if encryption is None else encryption.current

    def work(connection: Connection) -> dict[str, int]:
        counts = {}
        for target in _TARGETS:
            table = target.table
            counts[table.name] = connection.execute(
                select(func.count()).select_from(table).where(
                    or_(*(_stale(table.c[name]) for name in target.sealed),
                        *(_undigested(table.c[name]) for name in target.digested))),
                {"current_key": current}).scalar_one()
        return counts

    return run_in_transaction(engine, work)


__all__: Sequence[str] = ("DEFAULT_ROTATION_BATCH_SIZE", "rotate_encryption", "stale_counts")
