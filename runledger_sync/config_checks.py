"""The rules :meth:`runledger_sync.config.JobsConfig.validate` checks, one per field."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

from runledger_sync.config_env import MAX_CLAIM_BATCH_SIZE
from runledger_sync.core.errors import ValidationError
from runledger_sync.core.retention import Retention
from runledger_sync.core.types import EventLog
from runledger_sync.core.flow import check_queue_name
from runledger_sync.core.validation import WORKER_ID_MAX_LENGTH, check_job_type, check_text

#: A rule's argument is a JobsConfig (not imported: that module imports this one).
JobsConfig = Any

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


def _check_queues(config: JobsConfig) -> Optional[str]:
    value = config.queues
    if value is None:
        return None
    rule = "be None or a non-empty tuple of queue names"
    if not isinstance(value, tuple) or not value:
        return _problem("queues", rule, value)
    return _store_refusal("queues", lambda: [check_queue_name(q, "queues") for q in value])


def _check_queue_concurrency(config: JobsConfig) -> Optional[str]:
    value = config.queue_concurrency
    if value is None:
        return None
    rule = "be None or a mapping of queue name to a whole number of at least 1"
    if not isinstance(value, Mapping) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                             for n in value.values()):
        return _problem("queue_concurrency", rule, value)
    return _store_refusal("queue_concurrency", lambda: [check_queue_name(q, "queue_concurrency") for q in value])


def _check_log_payloads(config: JobsConfig) -> Optional[str]:
    if not isinstance(config.log_payloads, bool):
        return _problem("log_payloads", "be a bool", config.log_payloads)
    return None


def _check_event_log(config: JobsConfig) -> Optional[str]:
    levels = tuple(level.value for level in EventLog)
    if isinstance(config.event_log, str) and config.event_log in levels:
        return None
    return _problem("event_log", f"be one of {', '.join(repr(level) for level in levels)}", config.event_log)


def _check_retention(config: JobsConfig) -> Optional[str]:
    # Retention checks its own ages when it is built; anything else is refused here.
    if config.retention is None or isinstance(config.retention, Retention):
        return None
    return _problem("retention", "be an rl.Retention or None", config.retention)


#: Each field's rule: one problem string or None.
CHECKS: Mapping[str, Callable[[JobsConfig], Optional[str]]] = {
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
    "max_output_bytes": _int_at_least("max_output_bytes", 1),
    "job_types": _check_job_types,
    "queues": _check_queues,
    "queue_concurrency": _check_queue_concurrency,
    "log_payloads": _check_log_payloads,
    "event_log": _check_event_log,
    "retention": _check_retention,
    "prune_interval_seconds": _number("prune_interval_seconds", above=0),
}
