"""Flow control: queues, their limits, and why a due job waits.

Every job belongs to a queue (``"default"`` unless its type or its enqueue says
otherwise). A queue's settings live in the database (table ``job_queues``) so
that every worker and process reads the same ones:

- ``paused``: no worker claims the queue's jobs; enqueue still works.
- ``global_limit``: at most this many of its jobs LEASED at once, across workers.
- ``key_limit``: at most this many live jobs per concurrency key (the spec's
  execution resource key); the head of a key goes first. Default 1.
- ``rate_limit``: at most ``count`` claims in any window of ``per_seconds``,
  across workers; with ``per_key`` each concurrency key has its own budget.

``None`` means no limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Optional
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.queue_errors import InvalidConcurrencyKey, InvalidQueueName, InvalidQueueSetting

DEFAULT_QUEUE = "default"
QUEUE_NAME_MAX_LENGTH = 128
#: The spec's bound on an execution resource key (section 1).
CONCURRENCY_KEY_MAX_BYTES = 512
CONCURRENCY_KEY_MAX_LENGTH = 512
#: Limits are counts of jobs; beyond this they would limit nothing.
LIMIT_RANGE = (1, 1_000_000)
#: A rate window: from a millisecond to a year.
RATE_SECONDS_RANGE = (0.001, 366 * 24 * 3600.0)
DEFAULT_KEY_LIMIT = 1


def check_queue_name(value: Any, argument: str = "queue") -> str:
    return check.check_text(argument, value, max_length=QUEUE_NAME_MAX_LENGTH, error=InvalidQueueName)


def check_optional_queue_name(value: Any, argument: str = "queue") -> Optional[str]:
    return None if value is None else check_queue_name(value, argument)


def check_optional_concurrency_key(value: Any) -> Optional[str]:
    if value is None:
        return None
    return check.check_text("concurrency_key", value, max_length=CONCURRENCY_KEY_MAX_LENGTH,
                            max_bytes=CONCURRENCY_KEY_MAX_BYTES, error=InvalidConcurrencyKey)


def check_optional_limit(argument: str, value: Any) -> Optional[int]:
    """A limit is None (no limit) or a whole number of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not LIMIT_RANGE[0] <= value <= LIMIT_RANGE[1]:
        raise InvalidQueueSetting(argument, value, f"None or a whole number from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]:,}")
    return value


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` claims in any window of ``per_seconds`` (per concurrency key with ``per_key``).

    Example:
        ``rl.RateLimit(100, per_seconds=60)``: a hundred a minute.
    """

    count: int
    per_seconds: float = 1.0
    per_key: bool = False

    def __post_init__(self) -> None:
        count = self.count
        if isinstance(count, bool) or not isinstance(count, int) or not LIMIT_RANGE[0] <= count <= LIMIT_RANGE[1]:
            raise InvalidQueueSetting("rate_limit.count", count,
                                      f"a whole number of claims from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]:,}")
        seconds = self.per_seconds
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
                or not RATE_SECONDS_RANGE[0] <= seconds <= RATE_SECONDS_RANGE[1]):
            raise InvalidQueueSetting("rate_limit.per_seconds", seconds,
                                      f"a number of seconds from {RATE_SECONDS_RANGE[0]} to {RATE_SECONDS_RANGE[1]:,.0f}")
        if not isinstance(self.per_key, bool):
            raise InvalidQueueSetting("rate_limit.per_key", self.per_key, "True or False")
        object.__setattr__(self, "per_seconds", float(seconds))

    def __str__(self) -> str:
        per = f"{self.per_seconds:g} s"
        return f"{self.count} per {per}" + (" per key" if self.per_key else "")


def check_optional_rate_limit(value: Any) -> Optional[RateLimit]:
    if value is None or isinstance(value, RateLimit):
        return value
    raise InvalidQueueSetting("rate_limit", value, "None or an rl.RateLimit(count, per_seconds)")


@dataclass(frozen=True)
class QueueSpec:
    """A queue as code declares it (``registry.queue``); ``sync_definitions`` writes it, keeping a pause."""

    name: str
    global_limit: Optional[int] = None
    key_limit: Optional[int] = DEFAULT_KEY_LIMIT
    rate_limit: Optional[RateLimit] = None

    def checked(self) -> "QueueSpec":
        check_queue_name(self.name, "name")
        check_optional_limit("global_limit", self.global_limit)
        check_optional_limit("key_limit", self.key_limit)
        check_optional_rate_limit(self.rate_limit)
        return self


@dataclass(frozen=True)
class QueueRecord:
    """One row of ``job_queues``: a queue's settings, shared by every worker."""

    name: str
    paused: bool
    global_limit: Optional[int]
    key_limit: Optional[int]
    rate_limit: Optional[RateLimit]
    paused_at: Optional[datetime]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class QueueLoad:
    """A queue with what waits in it now: for ``stats``, ``top``, metrics and the dashboard."""

    queue: QueueRecord
    #: PENDING and due, ready to claim (no busy key holds them back).
    ready: int
    #: PENDING and due, held back by their concurrency key.
    blocked_by_key: int
    #: PENDING, not due yet (delayed, or retrying later).
    scheduled: int
    leased: int
    #: Claims inside the current rate window (0 without a rate limit).
    rate_used: int


class WaitReason(str, Enum):
    """Why a PENDING job is not running (see :func:`runledger_sync.store.queues.explain_wait`)."""

    NOT_DUE = "not_due"
    QUEUE_PAUSED = "queue_paused"
    KEY_BUSY = "key_busy"
    GLOBAL_LIMIT = "global_limit"
    RATE_LIMITED = "rate_limited"
    NO_WORKER = "no_worker"
    READY = "ready"
    #: A worker claimed it and handed it back: it does not hold the key the job is sealed under.
    ENCRYPTION_KEY_MISSING = "encryption_key_missing"


@dataclass(frozen=True)
class JobWait:
    """Why one job waits: a reason, the words an operator reads, and what it waits on."""

    reason: WaitReason
    message: str
    #: For KEY_BUSY: a live job of the same key (the one that holds the turn).
    blocking_job_id: Optional[UUID] = None
    #: For RATE_LIMITED and NOT_DUE: when the job may go.
    until: Optional[datetime] = None
