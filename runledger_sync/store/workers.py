"""Worker rows: which queues and job types each live worker serves, so an operator can be told nobody serves a job.

Each worker writes its row every few seconds while it runs and deletes it when
it stops; a row not written for :data:`WORKER_SEEN_WITHIN_SECONDS` is a worker gone.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Optional, Sequence

from sqlalchemy import Text, any_, bindparam, func, literal, or_, select
from sqlalchemy.dialects.postgresql import ARRAY, insert as pg_insert
from sqlalchemy.engine import Connection

from runledger_sync.db.schema_queues import job_workers
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction

#: A worker row not written for this long is a worker gone (workers write theirs every few seconds).
WORKER_SEEN_WITHIN_SECONDS = 60.0

_w = job_workers.c


def serves(connection: Connection, queue: str, job_type: str) -> bool:
    """Whether a live worker serves ``queue`` and ``job_type``."""
    return connection.execute(
        select(func.count()).where(
            _w.last_seen_at > func.now() - timedelta(seconds=WORKER_SEEN_WITHIN_SECONDS),
            # A bound value on the left: a str compared with func.any() turns the comparison
            # round and renders "any(...) = value", which PostgreSQL refuses as a syntax error.
            or_(_w.queues.is_(None), literal(queue, Text) == any_(_w.queues)),
            literal(job_type, Text) == any_(_w.job_types),
        )
    ).scalar_one() > 0


def record_worker(bind: Bind, worker_id: str, *, queues: Optional[Sequence[str]], job_types: Sequence[str]) -> None:
    """Say that ``worker_id`` is alive and what it serves (written again every few seconds while it runs)."""
    values = {"worker_id": worker_id, "hostname": socket.gethostname(), "pid": os.getpid(),
              "queues": None if queues is None else list(queues), "job_types": list(job_types)}
    statement = pg_insert(job_workers).values(
        **{k: bindparam(k, type_=ARRAY(Text)) if k in ("queues", "job_types") else v for k, v in values.items()})
    statement = statement.on_conflict_do_update(
        index_elements=[_w.worker_id],
        set_={"queues": statement.excluded.queues, "job_types": statement.excluded.job_types,
              "last_seen_at": func.now()},
    )
    run_in_transaction(bind, lambda connection: connection.execute(
        statement, {"queues": values["queues"], "job_types": values["job_types"]}))


def forget_worker(bind: Bind, worker_id: str) -> None:
    """Remove a stopping worker's row (and the rows of workers long gone)."""
    statement = job_workers.delete().where(or_(
        _w.worker_id == worker_id,
        _w.last_seen_at < func.now() - timedelta(seconds=10 * WORKER_SEEN_WITHIN_SECONDS),
    ))
    run_in_transaction(bind, lambda connection: connection.execute(statement))

