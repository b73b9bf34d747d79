"""A flag that threads can set, test and wait on, which makes its Event only when someone waits.

Every attempt carries several such flags (cancellation, deadline passed, attempt
ended), and almost none of them is ever waited on: a no-op job ends long before
its first heartbeat. A ``threading.Event`` costs a Condition and its locks to
build, so building one per flag per job cost the worker more than its own logic.
"""

from __future__ import annotations

import threading
from typing import Optional

# One lock for every flag: it guards only the moment a waiter makes the Event
# and the moment a setter looks for one, both rare and short.
_EVENT_LOCK = threading.Lock()


class Flag:
    """``set``/``is_set``/``wait`` like a ``threading.Event``, without one until a wait needs it."""

    __slots__ = ("_set", "_event")

    def __init__(self) -> None:
        self._set = False
        self._event: Optional[threading.Event] = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _EVENT_LOCK:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is set or ``timeout`` passes; return whether it is set."""
        if self._set:
            return True
        with _EVENT_LOCK:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)
