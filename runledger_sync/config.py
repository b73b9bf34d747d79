"""JobsConfig: the knobs of the worker, reaper and scheduler loops, and where they come from.

Build one with :meth:`JobsConfig.from_env` (environment variables, clamped to
safe ranges) or directly (not clamped; call :meth:`JobsConfig.validate`). Pass
it to the loops as an argument; nothing keeps it in a global.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from runledger_sync.core import backoff
from runledger_sync.core.errors import ConfigError, ValidationError
from runledger_sync.core.ids import uuid7
from runledger_sync.core.types import EventLog
from runledger_sync.core.validation import WORKER_ID_MAX_LENGTH, check_job_type, check_text

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
DEFAULT_JOB_TYPES: Optional[tuple[str, ...]] = None
DEFAULT_LOG_PAYLOADS: bool = False
#: Every event of the spec; ``transitions`` leaves out LEASED, STAGE_CHANGED to running and HEARTBEAT.
DEFAULT_EVENT_LOG: str = EventLog.FULL.value

#: The largest claim batch both validate() and from_env() allow.
MAX_CLAIM_BATCH_SIZE = 1000

ENV_PREFIX = "RUNLEDGER_"

#: Runledger's (Rust) variable names, accepted as aliases; ``RUNLEDGER_*`` wins.
ENV_ALIASES: Mapping[str, str] = {
    "worker_id": "JOBS_WORKER_ID",
    "poll_interval_ms": "JOBS_POLL_INTERVAL_MS",
    "claim_batch_size": "JOBS_CLAIM_BATCH_SIZE",
    "lease_ttl_seconds": "JOBS_LEASE_TTL_SECONDS",
    "max_global_concurrency": "JOBS_MAX_GLOBAL_CONCURRENCY",
    "reaper_interval_seconds": "JOBS_REAPER_INTERVAL_SECONDS",
    "schedule_poll_interval_seconds": "JOBS_SCHEDULE_POLL_INTERVAL_SECONDS",
    "reaper_retry_delay_ms": "JOBS_REAPER_RETRY_DELAY_MS",
    "event_log": "JOBS_EVENT_LOG",
}

# The ranges from_env() forces env values into (spec section 10), as (low, high).
# They are stricter than validate(): a TTL of 1 s is legal in a test config but
# never what an operator meant in production.
_ENV_CLAMPS: Mapping[str, tuple[float, Optional[float]]] = {
    "poll_interval_ms": (1, None),
    "claim_batch_size": (1, MAX_CLAIM_BATCH_SIZE),
    "lease_ttl_seconds": (10, None),
    "max_global_concurrency": (1, None),
    "reaper_interval_seconds": (1, None),
    "schedule_poll_interval_seconds": (1, None),
    "reaper_retry_delay_ms": (1000, None),
}

# How a default that is not a plain number reads in a start-up warning.
_DEFAULT_WORDS: Mapping[str, str] = {
    "heartbeat_interval_seconds": "a third of the lease",
    "job_types": "every registered type",
}

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
    "job_types",
    "event_log",
)
REAPER_FIELDS: tuple[str, ...] = (
    "claim_batch_size",
    "reaper_interval_seconds",
    "reaper_retry_delay_ms",
    "dead_letter_hook_timeout_seconds",
)
SCHEDULER_FIELDS: tuple[str, ...] = ("claim_batch_size", "schedule_poll_interval_seconds")


@dataclass(frozen=True)
class EnvAdjustment:
    """One environment value :meth:`JobsConfig.from_env` did not use as given.

    Attributes:
        variable: The variable read, e.g. ``JOBS_POLL_INTERVAL_MS``.
        field: The JobsConfig field it sets.
        given: The text found in the environment (stripped).
        used: The value used instead: the default, or the nearest allowed value.
        reason: Why, in plain words (``is below the minimum of 1``).
        is_default: ``used`` is the field's default (the given text did not parse).
    """

    variable: str
    field: str
    given: str
    used: Any
    reason: str
    is_default: bool = False

    @property
    def problem(self) -> str:
        """The value and what is wrong with it, as strict mode reports it."""
        return f"{self.variable}={self.given!r} {self.reason}"

    def describe(self) -> str:
        """The problem and the value used instead, as the worker logs it at start."""
        if not self.is_default:
            return f"{self.problem}; using {self.used!r} instead"
        return f"{self.problem}; using the default, {_DEFAULT_WORDS.get(self.field, repr(self.used))}"

    def log_fields(self) -> dict[str, Any]:
        """The ``extra=`` fields of the start-up warning."""
        return {"variable": self.variable, "given": self.given, "used": self.used, "reason": self.reason}


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
        max_payload_bytes: Largest JSON payload enqueue accepts.
        job_types: Restrict this worker to these registered types; None means all.
        log_payloads: Allow payloads in debug logs (off: payloads may hold secrets).
        event_log: Which events the worker writes: ``full`` (every event of the
            spec) or ``transitions`` (no LEASED, no STAGE_CHANGED to running, no
            HEARTBEAT rows; bench/README.md has what it saves).
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
    job_types: Optional[tuple[str, ...]] = DEFAULT_JOB_TYPES
    log_payloads: bool = DEFAULT_LOG_PAYLOADS
    event_log: str = DEFAULT_EVENT_LOG

    def __post_init__(self) -> None:
        # A list would make the frozen config unhashable; anything else that is
        # not a tuple is left for validate() to name.
        if isinstance(self.job_types, list):
            object.__setattr__(self, "job_types", tuple(self.job_types))

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
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        adjustments: list[EnvAdjustment] = []
        for config_field in dataclasses.fields(cls):
            name = config_field.name
            variable, raw = _lookup(env, name)
            if raw is None:
                continue
            parsed = _ENV_PARSERS[name](raw)
            if parsed is _UNPARSEABLE:
                reason = _UNPARSEABLE_REASONS[_ENV_PARSERS[name]]
                adjustments.append(EnvAdjustment(variable, name, raw, _default_of(config_field), reason, True))
                continue
            values[name], reason = _clamp(name, parsed)
            if reason is not None:
                adjustments.append(EnvAdjustment(variable, name, raw, values[name], reason))
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
        return self._validate_fields(tuple(_CHECKS))

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

    def _validate_fields(self, names: tuple[str, ...]) -> "JobsConfig":
        problems = [p for p in (_CHECKS[name](self) for name in names) if p is not None]
        if problems:
            raise ConfigError(problems)
        return self


# --- validation rules: each returns one problem string or None -----------------


def _problem(name: str, rule: str, value: Any) -> str:
    return f"jobs config {name} must {rule}, got {value!r}"


def _type_problem(name: str, expected: str, value: Any) -> Optional[str]:
    # bool is an int subclass: True would otherwise pass as a batch size of 1.
    if expected == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        return None
    article = "an" if expected == "integer" else "a"
    return _problem(name, f"be {article} {expected}", value) + f" ({type(value).__name__})"


def _int_at_least(name: str, low: int, high: Optional[int] = None) -> Callable[[JobsConfig], Optional[str]]:
    def check(config: JobsConfig) -> Optional[str]:
        value = getattr(config, name)
        bad_type = _type_problem(name, "integer", value)
        if bad_type:
            return bad_type
        if high is not None and not low <= value <= high:
            return _problem(name, f"be between {low} and {high}", value)
        if value < low:
            return _problem(name, f"be >= {low}", value)
        return None

    return check


def _number(
    name: str, *, above: Optional[float] = None, at_least: Optional[float] = None
) -> Callable[[JobsConfig], Optional[str]]:
    def check(config: JobsConfig) -> Optional[str]:
        value = getattr(config, name)
        bad_type = _type_problem(name, "finite number", value)
        if bad_type:
            return bad_type
        if above is not None and not value > above:
            return _problem(name, f"be > {above:g}", value)
        if at_least is not None and not value >= at_least:
            return _problem(name, f"be >= {at_least:g}", value)
        return None

    return check


def _check_worker_id(config: JobsConfig) -> Optional[str]:
    value = config.worker_id
    if not isinstance(value, str) or not value.strip():
        return _problem("worker_id", "be a non-blank string", value)
    return _store_refusal("worker_id", lambda: check_text("worker_id", value, max_length=WORKER_ID_MAX_LENGTH))


def _store_refusal(name: str, check: Callable[[], Any]) -> Optional[str]:
    """The store's own rule for a value, as a config problem: better refused here than on every claim."""
    try:
        check()
    except ValidationError as error:
        return f"jobs config {name} cannot be stored: {error.message}"
    return None


def _check_heartbeat_interval(config: JobsConfig) -> Optional[str]:
    value = config.heartbeat_interval_seconds
    if value is None:
        return None
    name = "heartbeat_interval_seconds"
    bad_type = _type_problem(name, "finite number", value)
    if bad_type:
        return bad_type
    if not value > 0:
        return _problem(name, "be > 0 when set", value)
    ttl = config.lease_ttl_seconds
    # A beat at or after the lease's end renews nothing; skip the comparison when
    # the TTL itself is broken, since its own check already reports it.
    if _type_problem("lease_ttl_seconds", "finite number", ttl) is None and not value < ttl:
        return _problem(name, f"be < lease_ttl_seconds ({ttl!r}) when set", value)
    return None


def _check_job_types(config: JobsConfig) -> Optional[str]:
    value = config.job_types
    if value is None:
        return None
    rule = "be None or a non-empty tuple of non-blank job type strings"
    if not isinstance(value, tuple) or not value:
        return _problem("job_types", rule, value)
    if any(not isinstance(t, str) or not t.strip() for t in value):
        return _problem("job_types", rule, value)
    return _store_refusal("job_types", lambda: [check_job_type(t) for t in value])


def _check_log_payloads(config: JobsConfig) -> Optional[str]:
    if not isinstance(config.log_payloads, bool):
        return _problem("log_payloads", "be a bool", config.log_payloads)
    return None


def _check_event_log(config: JobsConfig) -> Optional[str]:
    levels = tuple(level.value for level in EventLog)
    if isinstance(config.event_log, str) and config.event_log in levels:
        return None
    return _problem("event_log", f"be one of {', '.join(repr(level) for level in levels)}", config.event_log)


_CHECKS: Mapping[str, Callable[[JobsConfig], Optional[str]]] = {
    "worker_id": _check_worker_id,
    "poll_interval_ms": _number("poll_interval_ms", above=0),
    "claim_batch_size": _int_at_least("claim_batch_size", 1, MAX_CLAIM_BATCH_SIZE),
    "lease_ttl_seconds": _number("lease_ttl_seconds", at_least=1),
    "max_global_concurrency": _int_at_least("max_global_concurrency", 1),
    "reaper_interval_seconds": _number("reaper_interval_seconds", above=0),
    "schedule_poll_interval_seconds": _number("schedule_poll_interval_seconds", above=0),
    "reaper_retry_delay_ms": _int_at_least("reaper_retry_delay_ms", 1),
    "heartbeat_interval_seconds": _check_heartbeat_interval,
    "timeout_grace_seconds": _number("timeout_grace_seconds", at_least=0),
    "dead_letter_hook_timeout_seconds": _number("dead_letter_hook_timeout_seconds", above=0),
    "heartbeat_lock_timeout_ms": _int_at_least("heartbeat_lock_timeout_ms", 1),
    "max_payload_bytes": _int_at_least("max_payload_bytes", 1),
    "job_types": _check_job_types,
    "log_payloads": _check_log_payloads,
    "event_log": _check_event_log,
}


# --- environment parsing ---------------------------------------------------------

_UNPARSEABLE = object()


def _lookup(env: Mapping[str, str], name: str) -> tuple[str, Optional[str]]:
    """Return (variable, value) for a field; a blank value counts as unset."""
    candidates = [ENV_PREFIX + name.upper()]
    if name in ENV_ALIASES:
        candidates.append(ENV_ALIASES[name])
    for variable in candidates:
        raw = env.get(variable)
        if raw is not None and raw.strip():
            return variable, raw.strip()
    return candidates[0], None


def _parse_int(raw: str) -> Any:
    try:
        return int(raw)
    except ValueError:
        return _UNPARSEABLE


def _parse_number(raw: str) -> Any:
    try:
        value = float(raw)
    except ValueError:
        return _UNPARSEABLE
    if not math.isfinite(value):
        return _UNPARSEABLE
    return int(value) if value.is_integer() else value


def _parse_bool(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    return _UNPARSEABLE


def _parse_job_types(raw: str) -> Any:
    types = tuple(t.strip() for t in raw.split(",") if t.strip())
    return types or _UNPARSEABLE


def _parse_event_log(raw: str) -> Any:
    lowered = raw.lower()
    return lowered if lowered in {level.value for level in EventLog} else _UNPARSEABLE


_ENV_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "worker_id": lambda raw: raw,
    "poll_interval_ms": _parse_number,
    "claim_batch_size": _parse_int,
    "lease_ttl_seconds": _parse_number,
    "max_global_concurrency": _parse_int,
    "reaper_interval_seconds": _parse_number,
    "schedule_poll_interval_seconds": _parse_number,
    "reaper_retry_delay_ms": _parse_int,
    "heartbeat_interval_seconds": _parse_number,
    "timeout_grace_seconds": _parse_number,
    "dead_letter_hook_timeout_seconds": _parse_number,
    "heartbeat_lock_timeout_ms": _parse_int,
    "max_payload_bytes": _parse_int,
    "job_types": _parse_job_types,
    "log_payloads": _parse_bool,
    "event_log": _parse_event_log,
}


# Why each parser refused a value, in the words the start-up warning uses.
_UNPARSEABLE_REASONS: Mapping[Callable[[str], Any], str] = {
    _parse_int: "is not a whole number",
    _parse_number: "is not a finite number",
    _parse_bool: "is not a boolean (expected true/false, yes/no, on/off or 1/0)",
    _parse_job_types: "names no job type (expected a comma-separated list)",
    _parse_event_log: "is not an event log level (expected full or transitions)",
    _ENV_PARSERS["worker_id"]: "is not a worker id",
}


def _clamp(name: str, value: Any) -> tuple[Any, Optional[str]]:
    """Return the value forced into its env range, and why it changed (None if it did not)."""
    if name not in _ENV_CLAMPS:
        return value, None
    low, high = _ENV_CLAMPS[name]
    if value < low:
        return low, f"is below the minimum of {low:g}"
    if high is not None and value > high:
        return high, f"is above the maximum of {high:g}"
    return value, None


def _default_of(config_field: dataclasses.Field) -> Any:
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return config_field.default


