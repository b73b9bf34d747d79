"""The dashboard's rollup (revision 0009): one row per queue per minute, written once by a sampler.

The overview's charts read this table, never the finished jobs: a row holds
what the queue did in one closed minute (attempts that succeeded, were
scheduled for a retry, were dead-lettered; jobs canceled) and what waited in it
when the minute had closed (due jobs a worker could claim, and how long the
oldest of them had been due). Rows are written by the sampler on the workers'
upkeep thread (:mod:`runledger_sync.runtime.loops.sampling`), never on the claim or
completion path, and pruned with the rest by ``Retention.dashboard_rollup``.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Float, Integer, PrimaryKeyConstraint, Table, Text, text

from runledger_sync.db.schema import metadata

ZERO = text("0")

job_rollup_minutes = Table(
    "job_rollup_minutes",
    metadata,
    #: The minute the row covers, [minute, minute + 1 minute).
    Column("minute", DateTime(timezone=True), nullable=False),
    Column("queue", Text, nullable=False),
    Column("succeeded", Integer, nullable=False, server_default=ZERO),
    Column("retried", Integer, nullable=False, server_default=ZERO),
    Column("dead_lettered", Integer, nullable=False, server_default=ZERO),
    Column("canceled", Integer, nullable=False, server_default=ZERO),
    #: Due, claimable PENDING jobs when the row was sampled, just after the minute closed.
    Column("ready", Integer, nullable=False, server_default=ZERO),
    #: How long the oldest of them had been due then; NULL when none was.
    Column("oldest_due_wait_seconds", Float),
    Column("sampled_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Minute first: the charts read a range of minutes, the pruner the oldest ones,
    # and the sampler asks whether a minute is written, all on this key.
    PrimaryKeyConstraint("minute", "queue", name="pk_job_rollup_minutes"),
)
