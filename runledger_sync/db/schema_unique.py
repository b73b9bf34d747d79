"""The trigger that lets a unique or debounced job come back without colliding (revision 0013).

A row holds its key in the unique indexes (:data:`runledger_sync.db.schema.UNIQUE_LIVE`)
while its status is one of its ``unique_states``. Once it leaves them, another job
of its key may be enqueued. If the row could then come back into its states, its
update would break the index: a debounced job that started (LEASED, outside its
PENDING) and is retried, a claim handed back unstarted, an operator's requeue of
a finished unique job. So a row that comes back comes back without its states
(``unique_states`` is set NULL; the key stays, to be shown): it runs as a plain
job and never blocks again. The WHEN clause skips every other update without
calling the function, so plain jobs pay nothing.
"""

from __future__ import annotations

from typing import Callable

UNIQUE_REENTRY_FUNCTION = "runledger_unique_reentered"
UNIQUE_REENTRY_TRIGGER = "trg_job_queue_unique_reentered"
_BODY = "BEGIN NEW.unique_states := NULL; RETURN NEW; END"
_WHEN = (
    "NEW.unique_states IS NOT NULL AND NOT (OLD.status = ANY (OLD.unique_states)) "
    "AND NEW.status = ANY (NEW.unique_states)"
)


def unique_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    """The statements creating the re-entry function and its trigger; ``qualify`` names a schema object."""
    return [
        f"CREATE FUNCTION {qualify(UNIQUE_REENTRY_FUNCTION)}() RETURNS trigger LANGUAGE plpgsql AS $${_BODY}$$",
        f"CREATE TRIGGER {UNIQUE_REENTRY_TRIGGER} BEFORE UPDATE OF status ON {qualify('job_queue')} "
        f"FOR EACH ROW WHEN ({_WHEN}) EXECUTE FUNCTION {qualify(UNIQUE_REENTRY_FUNCTION)}()",
    ]


def drop_unique_trigger_ddl(qualify: Callable[[str], str]) -> list[str]:
    return [
        f"DROP TRIGGER IF EXISTS {UNIQUE_REENTRY_TRIGGER} ON {qualify('job_queue')}",
        f"DROP FUNCTION IF EXISTS {qualify(UNIQUE_REENTRY_FUNCTION)}()",
    ]
