"""Flow control's own storage (revision 0005): the rate-limit claim log, worker rows, and the key triggers.

``job_queues`` and job_queue's ``queue``, ``execution_resource_key`` and
``blocked_by_key`` columns are in :mod:`runledger_sync.db.schema`, which the
foreign keys need; what only flow control reads is here, on the same metadata.

**Concurrency keys.** A keyed job is *live* while it is PENDING and not held
back, or LEASED. A key has at most its queue's ``key_limit`` live jobs; the
others wait PENDING with ``blocked_by_key``, outside the claim index, so a
claim never reads them. Which of a key's PENDING jobs hold its turns is settled
in one place, :data:`KEY_SETTLE_FUNCTION`, whenever a transaction changes the
key's live jobs (a job enqueued or requeued, one finished, canceled,
dead-lettered or deleted): the LEASED jobs hold theirs, then a PENDING job
under way (a retry, a returned lease, a continuation: :data:`KEY_UNDER_WAY`),
then the rest in claim order, so a job due now is not held back by one due in an hour, and no later
job of the key overtakes a retry.

The settling runs when the transaction commits (deferred constraint triggers),
under one transaction-scoped advisory lock shared by every key. So an
application's transaction that enqueues a keyed job holds nothing while it
runs, and cannot hold up a worker's outcome write; two commits that change the
same keys settle one after the other, each seeing the other's rows, and never
wait for each other in a circle. The lock ends with the transaction (nothing is
held across transactions, so it works behind a transaction-pooling proxy). A
job being claimed at that moment (its row locked) keeps its turn. Until its
commit settles it, a new job carries a guess made without the lock
(:data:`KEY_GUESS_FUNCTION`), so most enqueues write their row once. The
triggers' WHEN clauses skip unkeyed rows without calling a function: plain
jobs pay nothing.

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

#: The one lock of key settling, shared by every key (see the module docstring); the settle
#: function spells it too.
KEY_LOCK = "SELECT pg_advisory_xact_lock(hashtext('runledger_sync.concurrency_keys'), 0)"

KEY_GUESS_FUNCTION = "runledger_concurrency_key_guess"
# Held back when the key's live jobs already fill its limit, as far as this
# statement can see; the commit settles it for certain. The statements are
# static (planned once per session); the tables' schema is written in when the
# function is created (``@job_queue@``, ``@job_queues@``).
KEY_GUESS_FUNCTION_BODY = """
DECLARE
  key_limit integer;
  live integer;
BEGIN
  SELECT q.key_limit INTO key_limit FROM @job_queues@ q WHERE q.name = NEW.queue;
  IF key_limit IS NULL THEN
    NEW.blocked_by_key := false;
    RETURN NEW;
  END IF;
  -- idx_job_queue_key_live: the key's live entries only, however many are held back.
  SELECT count(*) INTO live FROM @job_queue@ j
  WHERE j.queue = NEW.queue AND j.execution_resource_key = NEW.execution_resource_key
    AND j.status IN ('PENDING', 'LEASED') AND j.blocked_by_key IS FALSE AND j.id <> NEW.id;
  NEW.blocked_by_key := live >= key_limit;
  RETURN NEW;
END
"""

KEY_SETTLE_FUNCTION = "runledger_concurrency_key_settle"
KEY_SETTLE_FUNCTION_BODY = """
DECLARE
  row_queue text;
  row_key text;
  key_limit integer;
  leased integer;
  free uuid[];
  ready integer;
  room integer;
BEGIN
  IF TG_OP = 'DELETE' THEN
    row_queue := OLD.queue;
    row_key := OLD.execution_resource_key;
  ELSE
    row_queue := NEW.queue;
    row_key := NEW.execution_resource_key;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('runledger_sync.concurrency_keys'), 0);
  SELECT q.key_limit INTO key_limit FROM @job_queues@ q WHERE q.name = row_queue;
  IF key_limit IS NULL THEN
    UPDATE @job_queue@ SET blocked_by_key = false, updated_at = now() WHERE id IN (
      SELECT j.id FROM @job_queue@ j WHERE j.queue = row_queue AND j.execution_resource_key = row_key
        AND j.status = 'PENDING' AND j.blocked_by_key FOR UPDATE SKIP LOCKED);
    RETURN NULL;
  END IF;
  SELECT count(*) INTO leased FROM @job_queue@ j
  WHERE j.queue = row_queue AND j.execution_resource_key = row_key AND j.status = 'LEASED';
  -- The PENDING jobs holding a turn now. One a claim has locked is being claimed:
  -- it keeps its turn, and is not waited for.
  SELECT count(*) INTO ready FROM @job_queue@ j
  WHERE j.queue = row_queue AND j.execution_resource_key = row_key AND j.status = 'PENDING'
    AND j.blocked_by_key IS FALSE;
  free := array(SELECT j.id FROM @job_queue@ j
                WHERE j.queue = row_queue AND j.execution_resource_key = row_key AND j.status = 'PENDING'
                  AND j.blocked_by_key IS FALSE FOR UPDATE SKIP LOCKED);
  room := key_limit - leased - (ready - cardinality(free));
  -- The turns go to the free holders under way (claimed before in this run, or
  -- continued from an earlier one), then in claim
  -- order among them and the first held-back jobs. Nothing is waited for while
  -- the key lock is held: a held-back job another transaction has locked (being
  -- canceled) is passed over, and gets its turn at the key's next change if it
  -- is still waiting then.
  WITH held AS (
    SELECT j.id FROM @job_queue@ j
    WHERE j.queue = row_queue AND j.execution_resource_key = row_key AND j.status = 'PENDING' AND j.blocked_by_key
    ORDER BY j.priority DESC, j.next_run_at, j.created_at, j.id
    LIMIT key_limit FOR UPDATE SKIP LOCKED
  ), ranked AS (
    SELECT j.id, row_number() OVER (ORDER BY (@under_way@ AND NOT j.blocked_by_key) DESC,
                                    j.priority DESC, j.next_run_at, j.created_at, j.id) AS turn
    FROM @job_queue@ j
    WHERE j.id IN (SELECT unnest(free) UNION ALL SELECT h.id FROM held h)
  )
  UPDATE @job_queue@ q SET blocked_by_key = (r.turn > room), updated_at = now()
  FROM ranked r WHERE q.id = r.id AND q.blocked_by_key <> (r.turn > room);
  RETURN NULL;
END
"""
#: A PENDING job under way keeps its key's turn: claimed before in this run, or
#: continued from an earlier one (revision 0008; a continued job stays live, so
#: the key is not settled when it leaves LEASED, and it must not lose its turn
#: at the key's next change either: its checkpoint is work half done).
KEY_UNDER_WAY = "(j.attempt > 0 OR j.continuations > 0)"
#: The rule as revision 0005 wrote it, before jobs could continue.
KEY_UNDER_WAY_0005 = "j.attempt > 0"
_LIVE = "('PENDING', 'LEASED')"
_KEYED_NEW = "NEW.execution_resource_key IS NOT NULL"
_KEYED_OLD = "OLD.execution_resource_key IS NOT NULL"
#: (function, body, triggers): each trigger is (name, kind, timing and events, WHEN).
_FUNCTIONS = (
    (KEY_GUESS_FUNCTION, KEY_GUESS_FUNCTION_BODY, (
        ("trg_job_queue_key_enqueued", "TRIGGER", "BEFORE INSERT", f"{_KEYED_NEW} AND NEW.status = 'PENDING'"),
        ("trg_job_queue_key_reentered", "TRIGGER", "BEFORE UPDATE OF status",
         f"{_KEYED_NEW} AND NEW.status = 'PENDING' AND OLD.status NOT IN {_LIVE}"),
    )),
    (KEY_SETTLE_FUNCTION, KEY_SETTLE_FUNCTION_BODY, (
        ("trg_job_queue_key_settle_entered", "CONSTRAINT TRIGGER", "AFTER INSERT",
         f"{_KEYED_NEW} AND NEW.status = 'PENDING'"),
        ("trg_job_queue_key_settle_changed", "CONSTRAINT TRIGGER", "AFTER UPDATE OF status",
         f"{_KEYED_OLD} AND (OLD.status IN {_LIVE}) <> (NEW.status IN {_LIVE})"),
        ("trg_job_queue_key_settle_deleted", "CONSTRAINT TRIGGER", "AFTER DELETE",
         f"{_KEYED_OLD} AND OLD.status IN {_LIVE} AND NOT OLD.blocked_by_key"),
    )),
)
#: Every key trigger's name, for checks of what a migration built.
KEY_TRIGGER_NAMES = tuple(trigger for _, _, triggers in _FUNCTIONS for trigger, _, _, _ in triggers)


def _function_ddl(name: str, body: str, qualify: Callable[[str], str], under_way: str, *, replace: bool) -> str:
    for table in ("job_queues", "job_queue"):
        body = body.replace(f"@{table}@", qualify(table))
    create = "CREATE OR REPLACE FUNCTION" if replace else "CREATE FUNCTION"
    return f"{create} {qualify(name)}() RETURNS trigger LANGUAGE plpgsql AS $${body.replace('@under_way@', under_way)}$$"


def key_trigger_ddl(qualify: Callable[[str], str], *, under_way: str = KEY_UNDER_WAY) -> list[str]:
    """The statements creating the key trigger functions and their triggers; ``qualify`` names a schema object.

    ``under_way``: which PENDING jobs keep their key's turn (a revision passes the rule of its time).
    """
    statements = []
    for name, body, triggers in _FUNCTIONS:
        statements.append(_function_ddl(name, body, qualify, under_way, replace=False))
        for trigger, kind, timing, when in triggers:
            # A constraint trigger here is deferred: it settles the key as the transaction commits.
            deferred = " DEFERRABLE INITIALLY DEFERRED" if kind == "CONSTRAINT TRIGGER" else ""
            statements.append(
                f"CREATE {kind} {trigger} {timing} ON {qualify('job_queue')}{deferred} FOR EACH ROW WHEN ({when}) "
                f"EXECUTE FUNCTION {qualify(name)}()"
            )
    return statements


def key_settle_function_ddl(qualify: Callable[[str], str], *, under_way: str = KEY_UNDER_WAY) -> str:
    """The statement replacing the settle function with one whose turns follow ``under_way``."""
    return _function_ddl(KEY_SETTLE_FUNCTION, KEY_SETTLE_FUNCTION_BODY, qualify, under_way, replace=True)


def drop_key_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    statements = []
    for name, _, triggers in _FUNCTIONS:
        statements += [f"DROP TRIGGER IF EXISTS {trigger} ON {qualify('job_queue')}" for trigger, _, _, _ in triggers]
        statements.append(f"DROP FUNCTION IF EXISTS {qualify(name)}()")
    return statements
