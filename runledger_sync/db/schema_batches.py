"""Batches (revision 0014): ``job_batches``, and the triggers that keep its counts and finish it.

A batch's counts live on its row and are never counted from the members. Every
path that moves a job into or out of an ended status (the worker's outcome
write, single or grouped, the reaper, an operator's cancel or requeue, a
workflow's cancel, a bulk action) is an UPDATE of ``job_queue.status``, so one
trigger counts them all, in the transaction that moves the member:

* ``trg_job_queue_batch_member_added`` (AFTER INSERT, members only) adds the
  member to ``total`` and to the count of its status; it refuses a batch that is
  not OPEN (the store checks first and raises ``batch.closed``: this is the
  guard for a write that did not).
* ``trg_job_queue_batch_member_moved`` (AFTER UPDATE OF status, members only,
  and only when the status moves between the pending side, PENDING or LEASED,
  and an ended one, or between ended ones) moves the member from one count to
  the other: one row update. A claim or a retry stays on the pending side and
  does not call it; a plain job (batch_id NULL) never does.

A batch row left CLOSED with no pending member, by a member's count or by
``close_batch`` (an empty batch, or one whose members all ended), finishes in
the same transaction: ``trg_job_batches_finish`` (AFTER UPDATE of job_batches,
only for such a row) runs one UPDATE guarded by ``status = 'CLOSED' AND pending
= 0`` that moves it to SUCCEEDED or COMPLETED_WITH_ERRORS, and only the
transaction whose update matched enqueues the callbacks. A callback's payload
sealed at ``open_batch`` (encryption at rest) already holds the batch's id and is
bound to the callback's job id: the trigger copies it as it is. The row keeps the
``on_success`` job id of a batch that did not succeed (its payload stays bound to
it); the record shows that id only for a SUCCEEDED batch. The batch row's lock
orders the transactions that write it, so exactly one of them sees the batch
finish; the callbacks' ids were drawn at ``open_batch``, so a second insert
could only collide.

Locks: a member's job row (the writer's fence), then its batch row. An enqueue
of members locks the batch row first, but its job rows are new and nobody else's.
"""

from __future__ import annotations

from typing import Callable

from sqlalchemy import CheckConstraint, Column, DateTime, ForeignKey, Index, Integer, Table, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID

from runledger_sync.core.batch import CALLBACK_BATCH_ID_KEY, BatchStatus
from runledger_sync.core.encryption import SEALED_FIELD
from runledger_sync.core.states import JobStatus
from runledger_sync.core.workflow import WorkflowRunStatus
from runledger_sync.db.schema import EMPTY_JSON, META_IS_OBJECT, metadata, one_of, timestamp_columns

ZERO = text("0")

job_batches = Table(
    "job_batches",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("status", Text, nullable=False, server_default=text("'OPEN'")),
    Column("total", Integer, nullable=False, server_default=ZERO),
    Column("pending", Integer, nullable=False, server_default=ZERO),
    Column("succeeded", Integer, nullable=False, server_default=ZERO),
    Column("failed", Integer, nullable=False, server_default=ZERO),
    Column("canceled", Integer, nullable=False, server_default=ZERO),
    Column("meta", JSONB, nullable=False, server_default=EMPTY_JSON),
    # Each callback: its type and payload, and the id its job gets when the batch finishes
    # (drawn at open, so a second enqueue of it could only collide).
    Column("on_success_type", Text, ForeignKey("job_definitions.job_type", name="fk_job_batches_on_success_type")),
    Column("on_success_payload", JSONB),
    Column("on_success_job_id", UUID(as_uuid=True)),
    Column("on_complete_type", Text, ForeignKey("job_definitions.job_type", name="fk_job_batches_on_complete_type")),
    Column("on_complete_payload", JSONB),
    Column("on_complete_job_id", UUID(as_uuid=True)),
    Column("status_reason", Text),
    Column("closed_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    *timestamp_columns(stamped_by_statements=True),
    CheckConstraint(one_of("status", BatchStatus), name="ck_job_batches_status"),
    CheckConstraint(
        "pending >= 0 AND succeeded >= 0 AND failed >= 0 AND canceled >= 0 "
        "AND total = pending + succeeded + failed + canceled",
        name="ck_job_batches_counts",
    ),
    CheckConstraint(META_IS_OBJECT, name="ck_job_batches_meta_object"),
)
# The batches list, newest first, paged on (created_at, id), with a status or without.
Index("idx_job_batches_created", job_batches.c.created_at.desc(), job_batches.c.id.desc())
Index("idx_job_batches_status_created", job_batches.c.status, job_batches.c.created_at.desc(),
      job_batches.c.id.desc())
# Retention: finished batches by age, the prune's walk.
FINISHED_BATCHES = "status IN ('SUCCEEDED', 'COMPLETED_WITH_ERRORS', 'CANCELED')"
Index("idx_job_batches_finished", job_batches.c.finished_at, job_batches.c.id,
      postgresql_where=text(FINISHED_BATCHES))

BATCH_FINISH_FUNCTION = "runledger_batch_finish"
BATCH_FINISH_TRIGGER = "trg_job_batches_finish"
BATCH_MEMBER_FUNCTION = "runledger_batch_member_counted"
BATCH_MEMBER_ADDED_TRIGGER = "trg_job_queue_batch_member_added"
BATCH_MEMBER_MOVED_TRIGGER = "trg_job_queue_batch_member_moved"
BATCH_RUN_ADDED_TRIGGER = "trg_workflow_runs_batch_member_added"
BATCH_RUN_MOVED_TRIGGER = "trg_workflow_runs_batch_member_moved"
#: The SQLSTATE of a member written to a batch that is not OPEN past the store's check.
BATCH_CLOSED_SQLSTATE = "RLB01"


def _sql_list(statuses: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{status}'" for status in statuses) + ")"


# A member is a job or a workflow run (revision 0017); the two status sets share no
# value but SUCCEEDED and CANCELED, which mean the same for both, so one function
# counts either: a run is pending until it reaches a terminal status, and failed
# when it COMPLETED_WITH_ERRORS (a step failed, dead-lettered or was canceled).
_PENDING_SIDE = _sql_list((JobStatus.PENDING.value, JobStatus.LEASED.value,
                           WorkflowRunStatus.RUNNING.value, WorkflowRunStatus.WAITING_FOR_EXTERNAL.value))
_FAILED = _sql_list((JobStatus.DEAD_LETTERED.value, WorkflowRunStatus.COMPLETED_WITH_ERRORS.value))
_MOVED_WHEN = (
    "NEW.batch_id IS NOT NULL AND OLD.status <> NEW.status "
    f"AND NOT (OLD.status IN {_PENDING_SIDE} AND NEW.status IN {_PENDING_SIDE})"
)


def _finish_body(qualify: Callable[[str], str]) -> str:
    batches, jobs, definitions = qualify("job_batches"), qualify("job_queue"), qualify("job_definitions")
    all_succeeded = "failed = 0 AND canceled = 0"
    # Only schema object names and this module's constants are formatted in: no input.
    return f"""
DECLARE
  b record;
BEGIN
  UPDATE {batches}
     SET status = CASE WHEN {all_succeeded} THEN 'SUCCEEDED' ELSE 'COMPLETED_WITH_ERRORS' END,
         finished_at = now(), updated_at = now()
   WHERE id = NEW.id AND status = 'CLOSED' AND pending = 0
  RETURNING * INTO b;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  INSERT INTO {jobs} (id, job_type, payload, priority, max_attempts, timeout_seconds, queue, meta)
  -- A sealed payload already holds its batch id (sealed at open_batch, bound to its job id): copied as it is.
  SELECT c.job_id, d.job_type,
         CASE WHEN c.payload ? '{SEALED_FIELD}' THEN c.payload
              ELSE c.payload || jsonb_build_object('{CALLBACK_BATCH_ID_KEY}', b.id::text) END,
         d.default_priority, d.max_attempts, d.default_timeout_seconds, d.queue, b.meta
    FROM (VALUES (CASE WHEN b.status = 'SUCCEEDED' THEN b.on_success_job_id END, b.on_success_type,
                  b.on_success_payload),
                 (b.on_complete_job_id, b.on_complete_type, b.on_complete_payload)) AS c (job_id, job_type, payload)
    JOIN {definitions} d ON d.job_type = c.job_type
   WHERE c.job_id IS NOT NULL;
  -- Delivered at commit, like an enqueue's: idle workers wake for the callbacks.
  PERFORM pg_notify('runledger_jobs', t) FROM unnest(ARRAY[
    CASE WHEN b.status = 'SUCCEEDED' THEN b.on_success_type END, b.on_complete_type]) AS t
   WHERE t IS NOT NULL;
  RETURN NULL;
END"""  # noqa: S608


def _member_body(qualify: Callable[[str], str]) -> str:
    batches = qualify("job_batches")

    def delta(test: str) -> str:
        # The member joins the count of its new status and leaves the one of its old (none on insert).
        return (f"(NEW.status {test})::int "
                f"- (CASE WHEN TG_OP = 'UPDATE' THEN (OLD.status {test})::int ELSE 0 END)")

    # Only schema object names and this module's constants are formatted in: no input.
    return f"""
BEGIN
  UPDATE {batches}
     SET total = total + (TG_OP = 'INSERT')::int,
         pending = pending + {delta(f"IN {_PENDING_SIDE}")},
         succeeded = succeeded + {delta("= 'SUCCEEDED'")},
         failed = failed + {delta(f"IN {_FAILED}")},
         canceled = canceled + {delta("= 'CANCELED'")},
         updated_at = now()
   WHERE id = NEW.batch_id AND (TG_OP = 'UPDATE' OR status = 'OPEN');
  IF NOT FOUND AND TG_OP = 'INSERT' THEN
    RAISE EXCEPTION 'batch % takes no more members', NEW.batch_id USING ERRCODE = '{BATCH_CLOSED_SQLSTATE}';
  END IF;
  RETURN NULL;
END"""  # noqa: S608


def batch_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    """The statements creating the finish and member functions and their triggers; ``qualify`` names a schema object."""
    jobs = qualify("job_queue")
    member, finish = qualify(BATCH_MEMBER_FUNCTION), qualify(BATCH_FINISH_FUNCTION)
    return [
        f"CREATE FUNCTION {finish}() RETURNS trigger LANGUAGE plpgsql AS $${_finish_body(qualify)}$$",
        f"CREATE TRIGGER {BATCH_FINISH_TRIGGER} AFTER UPDATE ON {qualify('job_batches')} "
        f"FOR EACH ROW WHEN (NEW.status = 'CLOSED' AND NEW.pending = 0) EXECUTE FUNCTION {finish}()",
        f"CREATE FUNCTION {member}() RETURNS trigger LANGUAGE plpgsql AS $${_member_body(qualify)}$$",
        f"CREATE TRIGGER {BATCH_MEMBER_ADDED_TRIGGER} AFTER INSERT ON {jobs} "
        f"FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL) EXECUTE FUNCTION {member}()",
        f"CREATE TRIGGER {BATCH_MEMBER_MOVED_TRIGGER} AFTER UPDATE OF status ON {jobs} "
        f"FOR EACH ROW WHEN ({_MOVED_WHEN}) EXECUTE FUNCTION {member}()",
    ]


def run_member_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    """The triggers that count a workflow run as one member (revision 0017), with the jobs' function and rule."""
    runs, member = qualify("workflow_runs"), qualify(BATCH_MEMBER_FUNCTION)
    return [
        f"CREATE TRIGGER {BATCH_RUN_ADDED_TRIGGER} AFTER INSERT ON {runs} "
        f"FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL) EXECUTE FUNCTION {member}()",
        f"CREATE TRIGGER {BATCH_RUN_MOVED_TRIGGER} AFTER UPDATE OF status ON {runs} "
        f"FOR EACH ROW WHEN ({_MOVED_WHEN}) EXECUTE FUNCTION {member}()",
    ]


def member_function_ddl(qualify: Callable[[str], str]) -> str:
    """The member-counting function, as a replacement of the one a revision before 0017 wrote."""
    return (f"CREATE OR REPLACE FUNCTION {qualify(BATCH_MEMBER_FUNCTION)}() RETURNS trigger LANGUAGE plpgsql "
            f"AS $${_member_body(qualify)}$$")


def drop_run_member_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    runs = qualify("workflow_runs")
    return [f"DROP TRIGGER IF EXISTS {BATCH_RUN_MOVED_TRIGGER} ON {runs}",
            f"DROP TRIGGER IF EXISTS {BATCH_RUN_ADDED_TRIGGER} ON {runs}"]


def drop_batch_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    jobs = qualify("job_queue")
    return [
        f"DROP TRIGGER IF EXISTS {BATCH_MEMBER_MOVED_TRIGGER} ON {jobs}",
        f"DROP TRIGGER IF EXISTS {BATCH_MEMBER_ADDED_TRIGGER} ON {jobs}",
        f"DROP FUNCTION IF EXISTS {qualify(BATCH_MEMBER_FUNCTION)}()",
        f"DROP TRIGGER IF EXISTS {BATCH_FINISH_TRIGGER} ON {qualify('job_batches')}",
        f"DROP FUNCTION IF EXISTS {qualify(BATCH_FINISH_FUNCTION)}()",
    ]
