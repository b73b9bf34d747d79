"""Everything the runtime asks of the database, in one list: the seam between the loops and the SQL.

The runtime (:mod:`runledger_sync.runtime`) imports this module and no other
module of the store, so this page is the whole contract a worker, its reaper,
its scheduler and its listener hold with PostgreSQL; a test pins it. The
operations are written where their SQL lives (mostly private modules of this
package) and answer here, grouped by the step of a job's life they serve, as a
queue driver's interface groups them. Each keeps the signature of its home: an
Engine, a held connection or a Connection first, then keyword-only arguments.

Connections
    ``HeldConnection``: one connection a loop keeps for its many short
    transactions. ``ping``: one round trip, for readiness.

Claim
    ``claim_and_start_jobs``: on a held connection, lease up to ``limit`` due
    jobs of the given types and write their running in one round trip, as two
    transactions (``StartedClaim``: the jobs running, and any left unstarted).
    ``claim_prestart_jobs_for_types``: the claim alone, in one statement (a
    worker polling on a caller's connection). ``claim_jobs`` is the same claim
    for tools that lease jobs by hand (the attempt is spent at the claim).
    ``serves_limited_queue``: whether any served queue has a global or rate
    limit; when none has, the worker's claims pass ``unlimited_only`` and skip
    the counting and the rate log.

Start
    ``mark_job_running`` writes stage ``running`` for a job claimed on its own
    (a worker polling on a caller's connection); ``running_landed`` tells whether a mark whose reply was
    lost was written. ``release_unstarted_job_claim`` hands back a claim that
    never started (no handler, shutdown before start).

While the handler runs
    ``heartbeat_job`` renews the lease, ``update_job_progress`` stores progress
    and checkpoints, ``get_job`` reads the row an operator may have cancelled.

Outcome
    ``read_earlier_attempts``: what the run's earlier attempts mean for a
    failure's decision, ``step_allows_continuation`` a workflow job's
    continuation's. ``apply_transitions`` writes a group of decided outcomes
    of every kind (succeed, continue, retry, dead-letter), one fenced
    statement per group, then ends the workflow steps among them; the worker's
    completer passes its groups, and ``ctx.complete_in`` its one success in the
    handler's own transaction. ``read_back_outcomes`` tells of a group whose
    reply was lost which landed.

Workflow steps (``ctx.workflow``)
    ``load_step`` (a step's run and key) and ``step_output`` (a prerequisite's
    output).

Notify and listen
    ``CHANNEL`` (due jobs), ``SCHEDULES_CHANNEL`` (schedule changes),
    ``ENDED_CHANNEL`` (jobs that ended, named by ``ended_job_ids``) and
    ``CANCELED_CHANNEL`` (jobs an operator canceled);
    ``open_listener``, ``listen``, ``read_notifications`` and
    ``close_listener`` for the listening connection; ``new_probe_channel`` and
    ``send_probe`` to prove it still hears.

Maintenance
    ``reap_expired_leases`` (the reaper's batch), ``fire_due_schedules``
    (the scheduler's tick), ``prune`` (retention's batches) and
    ``sample_rollup`` (the dashboard's minute, written once a minute closes).

Workers
    ``record_worker`` says a worker is alive and which queues and types it
    serves (so an operator can be told nobody serves a waiting job);
    ``forget_worker`` removes it when it stops. ``list_queues``: the queues
    that exist, so a worker refuses a config naming any other.
"""

from __future__ import annotations

from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.claim.flow import serves_limited_queue
from runledger_sync.store.workers import forget_worker, record_worker
from runledger_sync.store.claim.start import StartedClaim, claim_and_start_jobs
from runledger_sync.store.admin.gauges import ping
from runledger_sync.store.held import HeldConnection
from runledger_sync.store.attempt.outcomes import apply_transitions, read_back_outcomes, read_earlier_attempts
from runledger_sync.store.notify import (
    CANCELED_CHANNEL,
    CHANNEL,
    ENDED_CHANNEL,
    SCHEDULES_CHANNEL,
    close_listener,
    ended_job_ids,
    listen,
    new_probe_channel,
    open_listener,
    read_notifications,
    send_probe,
)
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from runledger_sync.store.admin.rollup import sample_rollup
from runledger_sync.store.attempt.running import heartbeat_job, mark_job_running, running_landed, update_job_progress
from runledger_sync.store.maintenance.schedule_tick import fire_due_schedules
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.attempt.ends import release_unstarted_job_claim
from runledger_sync.store.queues import list_queues
from runledger_sync.store.maintenance.retention import prune
from runledger_sync.store.workflows.runs import load_step, step_allows_continuation, step_output

__all__ = [
    # connections
    "HeldConnection",
    "ping",
    # claim
    "claim_and_start_jobs",
    "StartedClaim",
    "claim_prestart_jobs_for_types",
    "claim_jobs",
    "serves_limited_queue",
    # start
    "mark_job_running",
    "running_landed",
    "release_unstarted_job_claim",
    # while the handler runs
    "heartbeat_job",
    "update_job_progress",
    "get_job",
    # outcome
    "read_earlier_attempts",
    "step_allows_continuation",
    "apply_transitions",
    "read_back_outcomes",
    # workflow steps
    "load_step",
    "step_output",
    # notify and listen
    "CHANNEL",
    "SCHEDULES_CHANNEL",
    "ENDED_CHANNEL",
    "CANCELED_CHANNEL",
    "ended_job_ids",
    "open_listener",
    "listen",
    "read_notifications",
    "close_listener",
    "new_probe_channel",
    "send_probe",
    # maintenance
    "reap_expired_leases",
    "fire_due_schedules",
    "prune",
    "sample_rollup",
    # workers
    "record_worker",
    "forget_worker",
    "list_queues",
]
