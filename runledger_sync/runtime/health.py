"""What :meth:`Supervisor.health` reports: each loop alive and turning, when it last did its work, the database.

Two answers come out of it, as container probes expect them. *Liveness*
(:attr:`SupervisorHealth.live`) asks only whether the loops run and keep turning:
a database outage is not a reason to restart a worker, which would only lose
the work it is doing. *Readiness* (:attr:`SupervisorHealth.ready`) adds that
the database answers.

The loops mark on a :class:`LoopMarks` each turn they start and each step that
succeeded (a claim, a reaper sweep, a scheduler tick); the supervisor reads the
marks and its threads. The database is asked on a connection of the
:class:`DatabaseProbe`'s own, so a pool that the worker's jobs (or the
application sharing the engine) have taken whole does not read as an outage.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Protocol

from runledger_sync.core.errors import RunledgerError
from runledger_sync.store.driver import Driver

#: The names under which the loops mark their steps.
CLAIM, REAP, TICK = "claim", "reap", "tick"
#: How long a loop may go without starting a turn, beyond its own interval, before
#: it counts as stalled. Generous: a claim sent to an unreachable host can wait
#: minutes for TCP to give up, and that is an outage, not a dead loop.
STALL_ALLOWANCE_SECONDS = 300.0
#: How long the readiness check waits for the database's answer.
DATABASE_CHECK_SECONDS = 2.0
#: What a health answer says of a database that did not answer: its code and
#: nothing of the URL (user, host, database name), which a health page must not show.
DATABASE_UNREACHABLE = "db.connection_failed: the database did not answer"


class _Listening(Protocol):
    @property
    def connected(self) -> bool: ...


class LoopMarks:
    """When each loop last started a turn and last finished a step without an error (wall clock)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._turns: dict[str, float] = {}
        #: The worker's LISTEN connection, once the worker has one.
        self.listener: Optional[_Listening] = None

    def mark(self, step: str) -> None:
        # One dict store: atomic under the GIL, so no lock on the claim path.
        self._last[step] = time.time()

    def last(self, step: str) -> Optional[datetime]:
        return _at(self._last.get(step))

    def seconds_since(self, step: str) -> Optional[float]:
        stamp = self._last.get(step)
        return None if stamp is None else time.time() - stamp

    def turned(self, loop: str) -> None:
        """``loop`` is starting a turn: it is not stuck."""
        self._turns[loop] = time.time()

    def last_turn(self, loop: str) -> Optional[datetime]:
        return _at(self._turns.get(loop))


def _at(stamp: Optional[float]) -> Optional[datetime]:
    return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc)


@dataclass(frozen=True)
class LoopHealth:
    """One loop: whether it runs, and when it last completed a step (None: not yet, or it has no steps).

    Attributes:
        name: ``worker``, ``reaper``, ``scheduler`` or ``listener`` (or a worker process's id).
        alive: The loop's thread (or process) is running; for the listener, its LISTEN is connected.
        last_success_at: The last claim, sweep or tick that did not fail.
        exit: Why a loop that is no longer alive ended, if it has.
        last_turn_at: When the loop last started a turn, failed or not.
        stalled: The loop has not started a turn for its interval plus
            :data:`STALL_ALLOWANCE_SECONDS`: its thread lives but no longer works.
    """

    name: str
    alive: bool
    last_success_at: Optional[datetime] = None
    exit: Optional[str] = None
    last_turn_at: Optional[datetime] = None
    stalled: bool = False


@dataclass(frozen=True)
class SupervisorHealth:
    """The answer of :meth:`Supervisor.health`.

    ``live`` asks that every loop but the listener be alive and not stalled: a
    lost LISTEN only makes an idle worker poll, so it is reported and not held
    against the process. ``ready`` asks that, and that the database answer.
    ``healthy`` is ``live``, as the metrics port's ``/health`` (an alias of
    ``/livez``) answers it.
    """

    loops: dict[str, LoopHealth]
    database_reachable: bool
    database_error: Optional[str] = None
    checked_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def live(self) -> bool:
        needed = [loop for name, loop in self.loops.items() if name != "listener"]
        return bool(needed) and all(loop.alive and not loop.stalled for loop in needed)

    @property
    def ready(self) -> bool:
        return self.live and self.database_reachable

    @property
    def healthy(self) -> bool:
        return self.live

    def as_dict(self, *, database: bool = True) -> dict[str, Any]:
        """A JSON-ready form (times in ISO 8601), as the metrics port serves it.

        Args:
            database: include the database's answer and ``ready`` (``/readyz``);
                False leaves them out (``/livez``, which does not ask the database).
        """
        answer: dict[str, Any] = {
            "healthy": self.healthy,
            "live": self.live,
            "checked_at": self.checked_at.isoformat(),
            "loops": {
                name: {"alive": loop.alive, "stalled": loop.stalled, "exit": loop.exit,
                       "last_success_at": _iso(loop.last_success_at), "last_turn_at": _iso(loop.last_turn_at)}
                for name, loop in self.loops.items()
            },
        }
        if database:
            answer |= {"ready": self.ready, "database_reachable": self.database_reachable,
                       "database_error": self.database_error}
        return answer


def _iso(moment: Optional[datetime]) -> Optional[str]:
    return None if moment is None else moment.isoformat()


class DatabaseProbe:
    """Asks the database ``SELECT 1`` on one connection of its own, and waits a bounded time for the answer.

    Its connection is opened on the first check and kept, so a server that has
    no connection slot left for newcomers (another client took them all) still
    answers it. A check still running when the next one comes is not doubled:
    the new one waits on the same answer.
    """

    def __init__(self, driver: Driver, timeout_seconds: float = DATABASE_CHECK_SECONDS) -> None:
        self._source = driver
        self.timeout_seconds = timeout_seconds
        self._apart: Optional[Driver] = None
        self._lock = threading.Lock()
        self._pending: Optional[threading.Thread] = None
        self._answer: Optional[str] = None

    def check(self) -> Optional[str]:
        """None when the database answered in time, else :data:`DATABASE_UNREACHABLE` or its error code."""
        with self._lock:
            if self._pending is None or not self._pending.is_alive():
                self._pending = threading.Thread(target=self._ask, name="runledger-health-probe", daemon=True)
                self._answer = DATABASE_UNREACHABLE
                self._pending.start()
            pending = self._pending
        pending.join(self.timeout_seconds)
        return DATABASE_UNREACHABLE if pending.is_alive() else self._answer

    def _ask(self) -> None:
        try:
            if self._apart is None:
                self._apart = self._source.apart(timeout_seconds=self.timeout_seconds)
            self._apart.ping()
        except RunledgerError as error:
            # The code only: the message of a failed connection names the server and the user.
            self._answer = DATABASE_UNREACHABLE if error.code == "db.connection_failed" else error.code
        except Exception as error:  # noqa: BLE001 - any other failure is an unready database too
            self._answer = f"{DATABASE_UNREACHABLE} ({type(error).__name__})"
        else:
            self._answer = None

    def close(self) -> None:
        if self._apart is not None:
            self._apart.close()
