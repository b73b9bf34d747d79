"""Flow control's own storage (revision 0005): the rate-limit claim log and the key trigger.

``job_queues`` and job_queue's ``queue``, ``execution_resource_key`` and
``blocked_by_key`` columns are in :mod:`runledger_sync.db.schema`, which the
foreign keys need; what only flow control reads is here, on the same metadata.

**Concurrency keys.** A keyed job is *live* while it is PENDING and not held
back, or LEASED. A key has at most its queue's ``key_limit`` live jobs; the
others wait PENDING with ``blocked_by_key``, outside the claim index, so a
claim never reads them. The key triggers are the one place that decides it:

- a keyed job entering (enqueued, or requeued from a finished state) is held
  back when its key already has ``key_limit`` live jobs; once it is written, if
  it comes before one of them in claim order that has not been claimed in this
  run, it takes that one's turn (a job due in an hour does not hold back one due
  now);
- a live keyed job leaving (finished, canceled, dead-lettered, deleted) lets the
  next held-back jobs of its key go, in claim order, up to the limit.

A retry or a returned lease keeps the job live, so it keeps its key's turn and
no later job of the key overtakes it. Each firing takes a transaction-scoped
advisory lock on its key before it counts, so an enqueue and a release of the
same key wait for each other and the second sees the first; the lock ends with
the transaction (nothing is held across transactions, so it works behind a
transaction-pooling proxy). The triggers' WHEN clauses skip unkeyed rows
without calling the function: plain jobs pay nothing.

**Rate limits.** Each claim from a rate-limited queue logs one row here (with
the job's key when the limit is per key); a claim counts the rows inside the
window before it takes more. The claim deletes the rows that fell out of it.
"""

from __future__ import annotations

from typing import Callable

from sqlalchemy import BigInteger, Column, DateTime, Identity, Index, Integer, Table, Text, text
from sqlalchemy.dialects.postgresql import ARRAY

from runledger_sync.db.schema import metadata

job_queue_rate_claims = Table(
    "job_queue_rate_claims",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("queue", Text, nullable=False),
    Column("concurrency_key", Text),
    Column("claimed_at", DateTime(timezone=True), nullable=False),
)
Index("idx_job_queue_rate_claims_window", job_queue_rate_claims.c.queue, job_queue_rate_claims.c.claimed_at)
Index(
    "idx_job_queue_rate_claims_key_window",
    job_queue_rate_claims.c.queue,
    job_queue_rate_claims.c.concurrency_key,
    job_queue_rate_claims.c.claimed_at,
    postgresql_where=text("concurrency_key IS NOT NULL"),
)

# Workers say which queues and types they serve, so an operator can be told that
# nobody serves a waiting job's. Each worker writes its row every few seconds and
# deletes it when it stops; a row not seen for a while is a worker gone.
job_workers = Table(
    "job_workers",
    metadata,
    Column("worker_id", Text, primary_key=True),
    Column("hostname", Text),
    Column("pid", Integer),
    #: NULL: every queue.
    Column("queues", ARRAY(Text)),
    Column("job_types", ARRAY(Text), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

KEY_TRIGGER_FUNCTION = "runledger_concurrency_key_turns"
KEY_TRIGGER_FUNCTION_BODY = """
DECLARE
  row_queue text;
  row_key text;
  row_id uuid;
  key_limit integer;
  live integer;
BEGIN
  IF TG_WHEN = 'BEFORE' THEN
    row_queue := NEW.queue;
    row_key := NEW.execution_resource_key;
    row_id := NEW.id;
  ELSE
    row_queue := OLD.queue;
    row_key := OLD.execution_resource_key;
    row_id := OLD.id;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('runledger_sync.concurrency_key'), hashtext(row_queue || chr(31) || row_key));
  EXECUTE format('SELECT key_limit FROM %I.job_queues WHERE name = $1', TG_TABLE_SCHEMA) INTO key_limit USING row_queue;
  IF key_limit IS NULL THEN
    live := 0;
  ELSE
    -- idx_job_queue_key_live: the key's live entries only, however many are held back.
    EXECUTE format('SELECT count(*) FROM %I.job_queue WHERE queue = $1 AND execution_resource_key = $2 '
                   'AND status IN (''PENDING'', ''LEASED'') AND NOT blocked_by_key AND id <> $3', TG_TABLE_SCHEMA)
      INTO live USING row_queue, row_key, row_id;
  END IF;
  IF TG_WHEN = 'BEFORE' THEN
    -- Nothing else is written here: an enqueue that meets its idempotency key is
    -- not inserted after this, and must leave no trace (see KEY_AHEAD_FUNCTION).
    NEW.blocked_by_key := key_limit IS NOT NULL AND live >= key_limit;
    RETURN NEW;
  END IF;
  IF key_limit IS NULL OR live < key_limit THEN
    -- The next held-back jobs in claim order, locked first: one changed meanwhile
    -- (canceled while this waited for it) is passed over for the one after it.
    EXECUTE format('UPDATE %I.job_queue SET blocked_by_key = false, updated_at = now() WHERE id = ANY(ARRAY('
                   'SELECT id FROM %I.job_queue WHERE queue = $1 AND execution_resource_key = $2 '
                   'AND status = ''PENDING'' AND blocked_by_key '
                   'ORDER BY priority DESC, next_run_at, created_at, id LIMIT $3 FOR UPDATE))',
                   TG_TABLE_SCHEMA, TG_TABLE_SCHEMA)
      USING row_queue, row_key, key_limit - live;
  END IF;
  RETURN NULL;
END
"""
KEY_AHEAD_FUNCTION = "runledger_concurrency_key_ahead"
# A job held back as it entered takes the turn of a live job of its key that has
# not been claimed in this run and comes after it in claim order (a job due in an
# hour must not hold back one due now): that one is held back instead. A job
# claimed already keeps its turn, and one being claimed at this moment is locked
# and passed over. AFTER the row is written: a repeated idempotent enqueue, which
# is not inserted, changes nothing.
KEY_AHEAD_FUNCTION_BODY = """
DECLARE
  behind uuid;
BEGIN
  -- Taken already by this row's BEFORE firing, in this transaction: taking it again costs nothing.
  PERFORM pg_advisory_xact_lock(hashtext('runledger_sync.concurrency_key'),
                                hashtext(NEW.queue || chr(31) || NEW.execution_resource_key));
  -- IS FALSE, not NOT: the claim index's predicate says NOT blocked_by_key and its order
  -- is this one's, so the planner (on a table not analyzed yet) could choose it and read
  -- every ready job of the queue; it cannot prove its predicate from IS FALSE.
  EXECUTE format('SELECT id FROM %I.job_queue WHERE queue = $1 AND execution_resource_key = $2 '
                 'AND status = ''PENDING'' AND blocked_by_key IS FALSE AND attempt = 0 AND id <> $3 '
                 'AND (-priority, next_run_at, created_at, id) > (-$4, $5, $6, $3) '
                 'ORDER BY priority, next_run_at DESC, created_at DESC, id DESC LIMIT 1 FOR UPDATE SKIP LOCKED',
                 TG_TABLE_SCHEMA)
    INTO behind USING NEW.queue, NEW.execution_resource_key, NEW.id, NEW.priority, NEW.next_run_at, NEW.created_at;
  IF behind IS NOT NULL THEN
    EXECUTE format('UPDATE %I.job_queue SET blocked_by_key = (id = $1), updated_at = now() WHERE id IN ($1, $2)',
                   TG_TABLE_SCHEMA)
      USING behind, NEW.id;
  END IF;
  RETURN NULL;
END
"""
_LIVE_OLD = "OLD.execution_resource_key IS NOT NULL AND OLD.status IN ('PENDING', 'LEASED') AND NOT OLD.blocked_by_key"
#: (trigger, timing and events, WHEN): each names the rows whose key's turns it changes.
KEY_TRIGGERS = (
    ("trg_job_queue_key_enqueued", "BEFORE INSERT",
     "NEW.execution_resource_key IS NOT NULL AND NEW.status = 'PENDING'"),
    ("trg_job_queue_key_reentered", "BEFORE UPDATE OF status",
     "NEW.execution_resource_key IS NOT NULL AND NEW.status = 'PENDING' AND OLD.status NOT IN ('PENDING', 'LEASED')"),
    ("trg_job_queue_key_released", "AFTER UPDATE OF status",
     f"{_LIVE_OLD} AND NEW.status NOT IN ('PENDING', 'LEASED')"),
    ("trg_job_queue_key_deleted", "AFTER DELETE", _LIVE_OLD),
)
#: The same for KEY_AHEAD_FUNCTION: a keyed job held back as it entered (enqueued or requeued).
KEY_AHEAD_TRIGGERS = (
    ("trg_job_queue_key_ahead", "AFTER INSERT OR UPDATE OF status",
     "NEW.execution_resource_key IS NOT NULL AND NEW.status = 'PENDING' AND NEW.blocked_by_key"),
)


def _functions() -> tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...]:
    return (KEY_TRIGGER_FUNCTION, KEY_TRIGGER_FUNCTION_BODY, KEY_TRIGGERS), (
        KEY_AHEAD_FUNCTION, KEY_AHEAD_FUNCTION_BODY, KEY_AHEAD_TRIGGERS)


def key_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    """The statements creating the key trigger functions and their triggers; ``qualify`` names a schema object."""
    statements = []
    for name, body, triggers in _functions():
        function = qualify(name)
        statements.append(f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $${body}$$")
        for trigger, timing, when in triggers:
            statements.append(
                f"CREATE TRIGGER {trigger} {timing} ON {qualify('job_queue')} FOR EACH ROW WHEN ({when}) "
                f"EXECUTE FUNCTION {function}()"
            )
    return statements


def drop_key_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    statements = []
    for name, _, triggers in _functions():
        statements += [f"DROP TRIGGER IF EXISTS {trigger} ON {qualify('job_queue')}" for trigger, _, _ in triggers]
        statements.append(f"DROP FUNCTION IF EXISTS {qualify(name)}()")
    return statements
