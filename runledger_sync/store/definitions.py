"""Job definitions: the row per job type that enqueue reads (attempts, timeout, priority, queue, enabled).

The registry writes its handlers' definitions (:func:`sync_job_definitions`);
an operator can switch a type off (:func:`set_job_definition_enabled`), after
which it cannot be enqueued.
"""

from __future__ import annotations

from typing import Iterable

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.core import validation as check
from runledger_sync.core.errors import DefinitionNotFoundOrDisabled, InvalidArgument
from runledger_sync.core.flow import check_queue_name
from runledger_sync.core.records import JobDefinition
from runledger_sync.db.schema import job_definitions, job_queues
from runledger_sync.store.binds import Bind
from runledger_sync.store.rows import DEFINITION_COLUMNS, to_record
from runledger_sync.store.transactions import run_in_transaction


def sync_job_definitions(
    bind: Bind, definitions: Iterable[JobDefinition], *, overwrite: bool = True
) -> list[JobDefinition]:
    """Write job definitions; ``overwrite=False`` only inserts the missing ones.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Returns:
        The definitions as stored after the call, in the order given.
    """
    definitions = list(definitions)
    for definition in definitions:
        check.check_job_type(definition.job_type)
        check.check_int("max_attempts", definition.max_attempts, check.MAX_ATTEMPTS_RANGE)
        check.check_int("default_timeout_seconds", definition.default_timeout_seconds, check.TIMEOUT_SECONDS_RANGE)
        check.check_int("default_priority", definition.default_priority, check.PRIORITY_RANGE)
        check.check_int("version", definition.version, (1, 2**31 - 1))
        check.check_int("max_continuations", definition.max_continuations, (1, 2**31 - 1))
        check_queue_name(definition.queue)
    if not definitions:
        return []
    rows = [
        {
            "job_type": d.job_type,
            "version": d.version,
            "max_attempts": d.max_attempts,
            "default_timeout_seconds": d.default_timeout_seconds,
            "default_priority": d.default_priority,
            "is_enabled": d.is_enabled,
            "queue": d.queue,
            "max_continuations": d.max_continuations,
        }
        for d in definitions
    ]
    statement = pg_insert(job_definitions).values(rows)
    if overwrite:
        excluded = statement.excluded
        statement = statement.on_conflict_do_update(
            index_elements=[job_definitions.c.job_type],
            # ON CONFLICT DO UPDATE skips the column's onupdate, and no trigger sets it (revision 0003).
            set_={name: excluded[name] for name in rows[0] if name != "job_type"} | {"updated_at": func.now()},
        )
    else:
        statement = statement.on_conflict_do_nothing(index_elements=[job_definitions.c.job_type])

    # A queue a definition names exists from then on, with no limits unless declared.
    queues = pg_insert(job_queues).values([{"name": name} for name in sorted({d.queue for d in definitions})])

    def work(connection: Connection) -> list[JobDefinition]:
        connection.execute(queues.on_conflict_do_nothing())
        connection.execute(statement)
        stored = connection.execute(
            select(*DEFINITION_COLUMNS).where(job_definitions.c.job_type.in_([d.job_type for d in definitions]))
        )
        by_type = {row.job_type: to_record(JobDefinition, row) for row in stored}
        return [by_type[d.job_type] for d in definitions]

    return run_in_transaction(bind, work)


def upsert_job_definition(bind: Bind, definition: JobDefinition) -> JobDefinition:
    """Insert or overwrite one job definition.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).
    """
    return sync_job_definitions(bind, [definition])[0]


def set_job_definition_enabled(bind: Bind, job_type: str, enabled: bool) -> JobDefinition:
    """Enable or disable a job type; a disabled type cannot be enqueued.

    Args:
        bind: an Engine (committed here), or a Connection, ORM Session or psycopg (2 or 3)
            connection whose open transaction the call joins (the caller commits).

    Raises:
        DefinitionNotFoundOrDisabled: there is no definition for the type.
    """
    check.check_job_type(job_type)
    # bool("no") is True: only a real bool may switch a type on or off.
    if not isinstance(enabled, bool):
        raise InvalidArgument("enabled", enabled, "True or False")
    statement = (
        job_definitions.update()
        .where(job_definitions.c.job_type == job_type)
        .values(is_enabled=enabled)
        .returning(*DEFINITION_COLUMNS)
    )

    def work(connection: Connection) -> JobDefinition:
        row = connection.execute(statement).first()
        if row is None:
            raise DefinitionNotFoundOrDisabled(f"job type {job_type!r} has no definition")
        return to_record(JobDefinition, row)

    return run_in_transaction(bind, work)
