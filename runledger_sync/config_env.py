"""Reading JobsConfig from the environment: variable names, the spec's clamps, and what was changed.

Spec section 10: an unparseable value falls back to the default and a value out
of range is forced into it. Each such change is returned as an
:class:`EnvAdjustment`, so the worker can say so at start and ``--strict-config``
can refuse it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.retention import Retention
from runledger_sync.core.types import EventLog

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
    "prune_interval_seconds": (1, None),
}

# How a default that is not a plain number reads in a start-up warning.
_DEFAULT_WORDS: Mapping[str, str] = {
    "heartbeat_interval_seconds": "a third of the lease",
    "job_types": "every registered type",
    "queues": "every queue",
    "queue_concurrency": "no cap per queue",
    "retention": "the default retention",
}

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


def read_env(fields: Iterable[dataclasses.Field], env: Mapping[str, str]) -> tuple[dict[str, Any], list[EnvAdjustment]]:
    """The values the environment gives for ``fields``, clamped, and every change made to them."""
    values: dict[str, Any] = {}
    adjustments: list[EnvAdjustment] = []
    for config_field in fields:
        name = config_field.name
        variable, raw = _lookup(env, name)
        if raw is None:
            continue
        parsed = _ENV_PARSERS[name](raw)
        if parsed is _UNPARSEABLE:
            unparseable = _UNPARSEABLE_REASONS[_ENV_PARSERS[name]]
            adjustments.append(EnvAdjustment(variable, name, raw, _default_of(config_field), unparseable, True))
            continue
        values[name], reason = _clamp(name, parsed)
        if reason is not None:
            adjustments.append(EnvAdjustment(variable, name, raw, values[name], reason))
    return values, adjustments


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


def _parse_queue_concurrency(raw: str) -> Any:
    caps: dict[str, Any] = {}
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        name, _, count = part.partition("=")
        number = _parse_int(count.strip())
        if not name.strip() or number is _UNPARSEABLE:
            return _UNPARSEABLE
        caps[name.strip()] = number
    return caps or _UNPARSEABLE


def _parse_event_log(raw: str) -> Any:
    lowered = raw.lower()
    return lowered if lowered in {level.value for level in EventLog} else _UNPARSEABLE


def _parse_retention(raw: str) -> Any:
    try:
        return Retention.parse(raw)
    except InvalidArgument:
        return _UNPARSEABLE


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
    "max_output_bytes": _parse_int,
    "job_types": _parse_job_types,
    "queues": _parse_job_types,
    "queue_concurrency": _parse_queue_concurrency,
    "log_payloads": _parse_bool,
    "event_log": _parse_event_log,
    "retention": _parse_retention,
    "prune_interval_seconds": _parse_number,
}


# Why each parser refused a value, in the words the start-up warning uses.
_UNPARSEABLE_REASONS: Mapping[Callable[[str], Any], str] = {
    _parse_int: "is not a whole number",
    _parse_number: "is not a finite number",
    _parse_bool: "is not a boolean (expected true/false, yes/no, on/off or 1/0)",
    _parse_job_types: "names no job type (expected a comma-separated list)",
    _parse_event_log: "is not an event log level (expected full or transitions)",
    _parse_queue_concurrency: "is not a list of queue=count (expected e.g. mail=2,default=8)",
    _parse_retention: "is not a retention (expected off, or kind=age pairs such as succeeded=7d,dead_lettered=keep)",
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


