"""JobsConfig: the knobs of the worker, reaper and scheduler loops, and where they come from.

The environment is read by :mod:`runledger_sync.config_env`.

Build one with :meth:`JobsConfig.from_env` (environment variables, clamped to
safe ranges) or directly (not clamped; call :meth:`JobsConfig.validate`). Pass
it to the loops as an argument; nothing keeps it in a global.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from runledger_sync.config_checks import CHECKS
from runledger_sync.config_env import EnvAdjustment, read_env
from runledger_sync.core.encryption import KEYS_VARIABLE, Encryption, configure_encryption
from runledger_sync.core import backoff
from runledger_sync.core.errors import ConfigError
from runledger_sync.core.ids import uuid7
from runledger_sync.core.retention import Retention
from runledger_sync.core import types as core_types

DEFAULT_POLL_INTERVAL_MS: float = 500
DEFAULT_CLAIM_BATCH_SIZE: int = 16
DEFAULT_LEASE_TTL_SECONDS: float = 60
DEFAULT_MAX_GLOBAL_CONCURRENCY: int = 32
DEFAULT_REAPER_INTERVAL_SECONDS: float = 15
DEFAULT_SCHEDULE_POLL_INTERVAL_SECONDS: float = 30
DEFAULT_REAPER_RETRY_DELAY_MS: int = 30_000
#: None means a third of the lease (see :func:`core.backoff.heartbeat_interval_seconds`).
DEFAULT_HEARTBEAT_INTERVAL_SECONDS: Optional[float] = None
DEFAULT_TIMEOUT_GRACE_SECONDS: float = 5.0
DEFAULT_DEAD_LETTER_HOOK_TIMEOUT_SECONDS: float = 10.0
DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS: int = 5_000
DEFAULT_MAX_PAYLOAD_BYTES: int = 1_048_576
DEFAULT_MAX_OUTPUT_BYTES: int = 1_048_576
DEFAULT_JOB_TYPES: Optional[tuple[str, ...]] = None
DEFAULT_LOG_PAYLOADS: bool = False
#: ``transitions``: no ENQUEUED, LEASED, STAGE_CHANGED to running or HEARTBEAT rows; ``full`` writes them.
DEFAULT_EVENT_LOG: str = core_types.DEFAULT_EVENT_LOG.value

#: On: succeeded and canceled jobs kept 7 days, dead-lettered jobs and finished workflow runs 30.
DEFAULT_RETENTION: Optional[Retention] = Retention()
DEFAULT_PRUNE_INTERVAL_SECONDS: float = 300

#: Every queue.
DEFAULT_QUEUES: Optional[tuple[str, ...]] = None
#: No cap of this worker's own per queue (the queues' own limits still hold).
DEFAULT_QUEUE_CONCURRENCY: Optional[Mapping[str, int]] = None

#: The fields each loop reads, so one loop's bad knob cannot stop another loop.
WORKER_LOOP_FIELDS: tuple[str, ...] = (
    "worker_id",
    "poll_interval_ms",
    "claim_batch_size",
    "lease_ttl_seconds",
    "max_global_concurrency",
    "heartbeat_interval_seconds",
    "timeout_grace_seconds",
    "dead_letter_hook_timeout_seconds",
    "heartbeat_lock_timeout_ms",
    "max_output_bytes",
    "job_types",
    "queues",
    "queue_concurrency",
    "event_log",
)
REAPER_FIELDS: tuple[str, ...] = (
    "claim_batch_size",
    "reaper_interval_seconds",
    "reaper_retry_delay_ms",
    "dead_letter_hook_timeout_seconds",
)
SCHEDULER_FIELDS: tuple[str, ...] = ("claim_batch_size", "schedule_poll_interval_seconds")
PRUNER_FIELDS: tuple[str, ...] = ("retention", "prune_interval_seconds")


def generate_worker_id() -> str:
    """Return a fresh worker id, ``worker-<uuidv7>``, unique per process start."""
    return f"worker-{uuid7()}"


@dataclass(frozen=True)
class JobsConfig:
    """Configure the worker, reaper and scheduler loops.

    Durations carry their unit in the name. Construction does not check
    anything; :meth:`validate` (or the loop that receives the config) does.

    Example:
        ``JobsConfig(poll_interval_ms=50, lease_ttl_seconds=5).validate()``

    Attributes:
        worker_id: Names this worker in leases and attempts.
        poll_interval_ms: Wait between claims when the last batch was short.
        claim_batch_size: Most jobs claimed (or reaped, or scheduled) per statement.
        lease_ttl_seconds: How long a claim lives without a heartbeat.
        max_global_concurrency: Most jobs running at once in this worker.
        reaper_interval_seconds: Wait between expired-lease sweeps.
        schedule_poll_interval_seconds: Wait between cron schedule sweeps.
        reaper_retry_delay_ms: Retry delay of a job whose lease expired.
        heartbeat_interval_seconds: Lease renewal period; None means a third of the lease.
        timeout_grace_seconds: Time a handler that ignores its cancellation flag
            gets after its deadline before the timeout failure is written anyway.
        dead_letter_hook_timeout_seconds: Most time one ``on_dead_letter`` call gets.
        heartbeat_lock_timeout_ms: Most time a heartbeat waits for the job's row lock.
        max_payload_bytes: Largest JSON payload enqueue accepts, and largest checkpoint a
            handler may save; a larger checkpoint is refused with ``job.checkpoint_too_large``.
        max_output_bytes: Largest JSON output a handler may return; a larger one
            dead-letters its job with ``job.output_too_large``, storing nothing of it.
        job_types: Restrict this worker to these registered types; None means all.
        queues: Claim only from these queues; None means every queue.
        queue_concurrency: Queue name -> most jobs of that queue running at once in
            this worker (its share, inside ``max_global_concurrency``).
        log_payloads: Allow payloads in debug logs (off: payloads may hold secrets).
        event_log: Which events enqueue and the worker write: ``transitions``
            (the default: no ENQUEUED, LEASED, STAGE_CHANGED to running or
            HEARTBEAT rows; bench/README.md has what it saves) or ``full`` (every
            event of the spec). Enqueue takes it as its ``event_log`` argument.
        retention: How long finished jobs and workflow runs are kept before the
            pruner deletes them (:class:`runledger_sync.Retention`); None keeps
            everything and runs no pruner.
        prune_interval_seconds: Wait between prunes (one worker prunes at a time).
    """

    worker_id: str = field(default_factory=generate_worker_id)
    poll_interval_ms: float = DEFAULT_POLL_INTERVAL_MS
    claim_batch_size: int = DEFAULT_CLAIM_BATCH_SIZE
    lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS
    max_global_concurrency: int = DEFAULT_MAX_GLOBAL_CONCURRENCY
    reaper_interval_seconds: float = DEFAULT_REAPER_INTERVAL_SECONDS
    schedule_poll_interval_seconds: float = DEFAULT_SCHEDULE_POLL_INTERVAL_SECONDS
    reaper_retry_delay_ms: int = DEFAULT_REAPER_RETRY_DELAY_MS
    heartbeat_interval_seconds: Optional[float] = DEFAULT_HEARTBEAT_INTERVAL_SECONDS
    timeout_grace_seconds: float = DEFAULT_TIMEOUT_GRACE_SECONDS
    dead_letter_hook_timeout_seconds: float = DEFAULT_DEAD_LETTER_HOOK_TIMEOUT_SECONDS
    heartbeat_lock_timeout_ms: int = DEFAULT_HEARTBEAT_LOCK_TIMEOUT_MS
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    job_types: Optional[tuple[str, ...]] = DEFAULT_JOB_TYPES
    queues: Optional[tuple[str, ...]] = DEFAULT_QUEUES
    queue_concurrency: Optional[Mapping[str, int]] = DEFAULT_QUEUE_CONCURRENCY
    log_payloads: bool = DEFAULT_LOG_PAYLOADS
    event_log: str = DEFAULT_EVENT_LOG
    retention: Optional[Retention] = DEFAULT_RETENTION
    prune_interval_seconds: float = DEFAULT_PRUNE_INTERVAL_SECONDS

    def __post_init__(self) -> None:
        # A list would make the frozen config unhashable; anything else that is
        # not a tuple is left for validate() to name.
        if isinstance(self.job_types, list):
            object.__setattr__(self, "job_types", tuple(self.job_types))
        if isinstance(self.queues, list):
            object.__setattr__(self, "queues", tuple(self.queues))

    @property
    def heartbeat_interval(self) -> float:
        """Return the effective seconds between lease renewals."""
        if self.heartbeat_interval_seconds is not None:
            return float(self.heartbeat_interval_seconds)
        return float(backoff.heartbeat_interval_seconds(self.lease_ttl_seconds))

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, *, strict: bool = False) -> "JobsConfig":
        """Build a config from ``RUNLEDGER_<FIELD>`` variables (or the Rust ``JOBS_*`` names).

        Every field has a ``RUNLEDGER_`` variable named after it in upper case
        (``RUNLEDGER_POLL_INTERVAL_MS``, ``RUNLEDGER_JOB_TYPES=a,b``). The eight
        Runledger fields and ``event_log`` also read their ``JOBS_*`` name when the
        ``RUNLEDGER_`` one is unset or blank. Values are forced into the spec's ranges (poll
        >= 1 ms, batch 1..1000, TTL >= 10 s, concurrency >= 1, reaper and
        schedule intervals >= 1 s, reaper delay >= 1000 ms), and a value that
        does not parse is replaced by the default. Each such change is kept in
        :attr:`env_adjustments`, and the worker logs one warning per change when
        it starts. A blank worker id means a generated one. The result is not
        validated.

        With ``RUNLEDGER_ENCRYPTION_KEYS`` set it also configures the process's
        encryption keys (:meth:`runledger_sync.Encryption.from_env`).

        Example:
            ``config = JobsConfig.from_env(); config.validate()``

        Args:
            environ: Variables to read; ``os.environ`` when None.
            strict: Refuse instead of replacing or clamping any value.

        Returns:
            The config.

        Raises:
            ConfigError: ``strict`` is set and a value would have been changed;
                ``.problems`` names every such variable.
            InvalidEncryptionKey: ``RUNLEDGER_ENCRYPTION_KEYS`` is set but a key or the current id is bad.
        """
        env = os.environ if environ is None else environ
        if (env.get(KEYS_VARIABLE) or "").strip():
            # Process-wide, as configure_encryption: every enqueue and worker of the process seals with these keys.
            configure_encryption(Encryption.from_env(env))
        values, adjustments = read_env(dataclasses.fields(cls), env)
        if strict and adjustments:
            raise ConfigError([adjustment.problem for adjustment in adjustments])
        return cls(**values)._with_env_adjustments(tuple(adjustments))

    @property
    def env_adjustments(self) -> tuple[EnvAdjustment, ...]:
        """The environment values :meth:`from_env` replaced or clamped (empty otherwise)."""
        return self.__dict__.get("_env_adjustments", ())

    def _with_env_adjustments(self, adjustments: tuple[EnvAdjustment, ...]) -> "JobsConfig":
        # Not a dataclass field: it is a record of where the values came from,
        # not a knob, so it stays out of equality, repr and fields().
        object.__setattr__(self, "_env_adjustments", adjustments)
        return self

    def with_overrides(self, **changes: Any) -> "JobsConfig":
        """Return a copy with some fields replaced (not validated).

        An environment adjustment of a replaced field is dropped: that value is no
        longer used.
        """
        kept = tuple(adjustment for adjustment in self.env_adjustments if adjustment.field not in changes)
        return dataclasses.replace(self, **changes)._with_env_adjustments(kept)

    def validate(self) -> "JobsConfig":
        """Check every field and report every problem at once.

        Returns:
            This config, so ``JobsConfig(...).validate()`` can be assigned.

        Raises:
            ConfigError: One or more fields are out of range; ``.problems``
                lists them as ``"jobs config <field> must <rule>, got <value>"``.
        """
        return self._validate_fields(tuple(CHECKS))

    def validate_worker_loop(self) -> "JobsConfig":
        """Check only the fields the worker loop reads (:data:`WORKER_LOOP_FIELDS`).

        Raises:
            ConfigError: One or more of those fields are out of range.
        """
        return self._validate_fields(WORKER_LOOP_FIELDS)

    def validate_reaper(self) -> "JobsConfig":
        """Check only the fields the reaper loop reads (:data:`REAPER_FIELDS`).

        Raises:
            ConfigError: One or more of those fields are out of range.
        """
        return self._validate_fields(REAPER_FIELDS)

    def validate_scheduler(self) -> "JobsConfig":
        """Check only the fields the scheduler loop reads (:data:`SCHEDULER_FIELDS`).

        Raises:
            ConfigError: One or more of those fields are out of range.
        """
        return self._validate_fields(SCHEDULER_FIELDS)

    def validate_pruner(self) -> "JobsConfig":
        """Check only the fields the pruner reads (:data:`PRUNER_FIELDS`).

        Raises:
            ConfigError: One or more of those fields are out of range.
        """
        return self._validate_fields(PRUNER_FIELDS)

    def _validate_fields(self, names: tuple[str, ...]) -> "JobsConfig":
        problems = [p for p in (CHECKS[name](self) for name in names) if p is not None]
        if problems:
            raise ConfigError(problems)
        return self


__all__ = [
    "JobsConfig",
    "generate_worker_id",
]
