"""How commands show a queue: its settings and what waits in it, as table cells or JSON-ready data.

Shared by ``queues``, ``stats`` and ``top``, so the three agree on names and units.
"""

from __future__ import annotations

from typing import Any, Optional

#: The columns of a queue's row, in ``queues list`` and ``stats``.
QUEUE_COLUMNS = ("queue", "paused", "global_limit", "key_limit", "rate_limit", "ready", "held_by_key", "scheduled",
                 "leased")


def rate_text(rate: Any) -> str:
    """A rate limit as ``queues set --rate`` takes it: ``100/60s``, ``5/1s per key``; ``-`` for none."""
    if rate is None:
        return "-"
    return f"{rate.count}/{rate.per_seconds:g}s" + (" per key" if rate.per_key else "")


def limit_text(limit: Optional[int]) -> str:
    return "-" if limit is None else str(limit)


def queue_row(load: Any) -> tuple[Any, ...]:
    """A :class:`~runledger_sync.QueueLoad` as the cells of :data:`QUEUE_COLUMNS`."""
    queue = load.queue
    return (queue.name, "yes" if queue.paused else "no", limit_text(queue.global_limit), limit_text(queue.key_limit),
            rate_text(queue.rate_limit), load.ready, load.blocked_by_key, load.scheduled, load.leased)


def queue_data(load: Any) -> dict[str, Any]:
    """A :class:`~runledger_sync.QueueLoad` as one flat JSON object (None: no limit)."""
    queue = load.queue
    rate = queue.rate_limit
    return {
        "name": queue.name, "paused": queue.paused, "paused_at": queue.paused_at,
        "global_limit": queue.global_limit, "key_limit": queue.key_limit,
        "rate_limit": None if rate is None else {"count": rate.count, "per_seconds": rate.per_seconds,
                                                 "per_key": rate.per_key},
        "ready": load.ready, "blocked_by_key": load.blocked_by_key, "scheduled": load.scheduled,
        "leased": load.leased, "rate_used": load.rate_used,
        "created_at": queue.created_at, "updated_at": queue.updated_at,
    }
