"""Jobs that coordinate at enqueue: one live job per key (:class:`Unique`), or one waiting job per key (:class:`Debounce`).

A debounced job's later enqueues replace its payload and meta and move its start.

Both are decided by the database in the enqueue's one statement, against a
partial unique index over ``(job_type, organization_id, unique_key)`` whose
predicate holds while the row's status is one of its ``unique_states``
(:mod:`runledger_sync.db.schema`). So concurrent enqueues from any number of
processes, in the callers' own transactions too, meet one another there and
nothing is locked past the statement.

A job that leaves its states stops blocking (a unique job that succeeded, a
debounced job that started). One that comes back into them later (a started
debounced job retried, an operator's requeue of a finished one) comes back
without them, so it never collides with the job that took its place.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional, Union

from runledger_sync.core import validation as check
from runledger_sync.core.coordination_errors import InvalidDebounce, InvalidUnique
from runledger_sync.core.states import JobStatus

Seconds = Union[timedelta, int, float]

#: A debounced job is replaced only while it waits: once started, the next enqueue makes a new job.
DEBOUNCE_STATES = (JobStatus.PENDING.value,)
#: A key is held by the unique index with its type and organization, within PostgreSQL's
#: 2,704-byte index row (the period's bucket adds 21 bytes).
KEY_MAX_LENGTH = check.IDEMPOTENCY_KEY_MAX_LENGTH
KEY_MAX_BYTES = check.IDEMPOTENCY_KEY_MAX_BYTES


@dataclass(frozen=True)
class Unique:
    """At most one live job per key: an enqueue that meets one returns it (``disposition == "existing"``).

    Args:
        key: What makes two jobs the same, besides their type and organization;
            None uses the payload (a digest of it).
        period: Buckets the key by ``floor(now / period)`` on the database's
            clock: one job per key per period (a timedelta or seconds, whole
            seconds, at least one).
        states: The statuses in which a job blocks its duplicates (default
            PENDING and LEASED: a job that finished no longer blocks).

    Example:
        ``rl.enqueue(engine, "sync.account", {"account": 7}, unique=rl.Unique(period=timedelta(minutes=5)))``
    """

    key: Optional[str] = None
    period: Optional[Seconds] = None
    #: Waiting or running, unless told otherwise (spelled out, so the reference shows the values).
    states: Iterable[str] = ("PENDING", "LEASED")

    def checked(self) -> "CheckedUnique":
        """The options checked; raises :class:`InvalidUnique` (``job.invalid_unique``) for the first bad one."""
        key = None if self.key is None else _key("unique.key", self.key, InvalidUnique)
        period = None
        if self.period is not None:
            period = _seconds("unique.period", self.period, InvalidUnique)
            if period != int(period):
                raise InvalidUnique("unique.period", self.period, "a whole number of seconds")
        return CheckedUnique(key, None if period is None else int(period), _states(self.states))


@dataclass(frozen=True)
class Debounce:
    """One waiting job per key: a later enqueue replaces its payload and meta and moves its start (``"replaced"``).

    The job runs ``delay`` after the last enqueue, but never later than
    ``max_delay`` after the first. Once it has started, the next enqueue makes a
    new job (``"created"``).

    Args:
        key: The key jobs of the type and organization are debounced by.
        delay: How long after an enqueue the job waits for the next one (a timedelta or seconds).
        max_delay: The longest the first enqueue waits, however many follow; at least ``delay``.

    Example:
        ``rl.enqueue(engine, "search.reindex", {"doc": 7}, debounce=rl.Debounce("doc-7", timedelta(seconds=5),
        timedelta(minutes=1)))``
    """

    key: str
    delay: Seconds
    max_delay: Seconds

    def checked(self) -> "CheckedDebounce":
        """The options checked; raises :class:`InvalidDebounce` (``job.invalid_debounce``) for the first bad one."""
        key = _key("debounce.key", self.key, InvalidDebounce)
        delay = _seconds("debounce.delay", self.delay, InvalidDebounce)
        max_delay = _seconds("debounce.max_delay", self.max_delay, InvalidDebounce)
        if max_delay < delay:
            raise InvalidDebounce("debounce.max_delay", self.max_delay, f"at least the delay ({delay:g} seconds)")
        return CheckedDebounce(key, delay, max_delay)


@dataclass(frozen=True)
class CheckedUnique:
    key: Optional[str]
    period_seconds: Optional[int]
    states: tuple[str, ...]

    def base_key(self, payload: Any, keyed_hash: Optional[Callable[[str], str]] = None) -> str:
        """The key before its period's bucket: the one given, or a digest of the payload (keyed, given ``keyed_hash``)."""
        if self.key is not None:
            return self.key
        # Key order and spacing must not make two equal payloads differ.
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if keyed_hash is not None:
            return "hmac:" + keyed_hash(canonical)
        return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CheckedDebounce:
    key: str
    delay_seconds: float
    max_delay_seconds: float


def _key(argument: str, value: Any, error: type[InvalidUnique] | type[InvalidDebounce]) -> str:
    return check.check_text(argument, value, max_length=KEY_MAX_LENGTH, max_bytes=KEY_MAX_BYTES, error=error)


def _seconds(argument: str, value: Any, error: type[InvalidUnique] | type[InvalidDebounce]) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    low, high = check.DELAY_SECONDS_RANGE
    number_like = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not number_like or not math.isfinite(seconds) or not low < seconds <= high:
        raise error(argument, value, f"a positive timedelta or number of seconds, at most {high}")
    return float(seconds)


def _states(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidUnique("unique.states", value, "a sequence of job statuses")
    allowed = {status.value for status in JobStatus}
    states = []
    for state in value:
        name = state.value if isinstance(state, JobStatus) else state
        if name not in allowed:
            raise InvalidUnique("unique.states", state, f"one of {', '.join(sorted(allowed))}")
        if name not in states:
            states.append(name)
    if not states:
        raise InvalidUnique("unique.states", value, "at least one job status")
    # In the enum's order, so equal sets are stored alike.
    return tuple(status.value for status in JobStatus if status.value in states)


def given_coordination(unique: Any, debounce: Any) -> tuple[Optional[Unique], Optional[Debounce]]:
    """An enqueue's ``unique`` and ``debounce`` as the options they mean, False for ``unique`` as None.

    A type's default unique (``registry.job(unique=...)``) is given to a call
    whose ``unique`` is None, so False is how one call says "not unique". Any
    other value of the wrong kind raises :class:`InvalidUnique` or
    :class:`InvalidDebounce` here, before its options are read.
    """
    if unique is False:
        unique = None
    elif unique is not None and not isinstance(unique, Unique):
        raise InvalidUnique("unique", unique, "an rl.Unique, False (not unique) or None")
    if debounce is not None and not isinstance(debounce, Debounce):
        raise InvalidDebounce("debounce", debounce, "an rl.Debounce or None")
    return unique, debounce
