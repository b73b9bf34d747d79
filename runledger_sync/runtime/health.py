"""What :meth:`Supervisor.health` reports: each loop alive or not, when it last did its work, the database.

The loops mark their successful steps on a :class:`LoopMarks` (a claim, a reaper
sweep, a scheduler tick); the supervisor reads the marks and its threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Protocol

#: The names under which the loops mark their steps.
CLAIM, REAP, TICK = "claim", "reap", "tick"


class _Listening(Protocol):
    @property
    def connected(self) -> bool: ...


class LoopMarks:
    """When each loop last finished a step without an error (wall clock), and the worker's listener."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        #: The worker's LISTEN connection, once the worker has one.
        self.listener: Optional[_Listening] = None

    def mark(self, step: str) -> None:
        # One dict store: atomic under the GIL, so no lock on the claim path.
        self._last[step] = time.time()

    def last(self, step: str) -> Optional[datetime]:
        stamp = self._last.get(step)
        return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc)


@dataclass(frozen=True)
class LoopHealth:
    """One loop: whether it runs, and when it last completed a step (None: not yet, or it has no steps).

    Attributes:
        name: ``worker``, ``reaper``, ``scheduler`` or ``listener`` (or a worker process's id).
        alive: The loop's thread (or process) is running; for the listener, its LISTEN is connected.
        last_success_at: The last claim, sweep or tick that did not fail.
        exit: Why a loop that is no longer alive ended, if it has.
    """

    name: str
    alive: bool
    last_success_at: Optional[datetime] = None
    exit: Optional[str] = None


@dataclass(frozen=True)
class SupervisorHealth:
    """The answer of :meth:`Supervisor.health`.

    ``healthy`` asks that every loop but the listener be alive and the database
    answer: a lost LISTEN only makes an idle worker poll, so it is reported and
    not held against the process.
    """

    loops: dict[str, LoopHealth]
    database_reachable: bool
    database_error: Optional[str] = None
    checked_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def healthy(self) -> bool:
        needed = [loop for name, loop in self.loops.items() if name != "listener"]
        return bool(needed) and all(loop.alive for loop in needed) and self.database_reachable

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (times in ISO 8601), as the metrics port's ``/health`` serves it."""
        return {
            "healthy": self.healthy,
            "database_reachable": self.database_reachable,
            "database_error": self.database_error,
            "checked_at": self.checked_at.isoformat(),
            "loops": {
                name: {"alive": loop.alive, "exit": loop.exit,
                       "last_success_at": None if loop.last_success_at is None else loop.last_success_at.isoformat()}
                for name, loop in self.loops.items()
            },
        }
