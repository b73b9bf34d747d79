"""The one periodic loop: check the config, then one step per interval until shutdown.

The reaper and the scheduler run it on the supervisor's threads; the upkeep
beside them (the worker's row, the sampler, the pruner) runs it on a
:class:`PeriodicThread` of its own.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from runledger_sync.core.errors import ConfigError
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.logging import get_logger

log = get_logger(__name__)


def run_periodically(
    name: str,
    validate: Callable[[], object],
    step: Callable[[], Optional[float]],
    interval_seconds: float,
    shutdown_event: threading.Event,
    on_success: Optional[Callable[[], None]] = None,
    pause: Optional[Callable[[float], object]] = None,
    on_turn: Optional[Callable[[], None]] = None,
    first_delay_seconds: float = 0.0,
) -> RuntimeLoopExit:
    """Run ``step`` until shutdown, waiting what it returns (None: ``interval_seconds``) between runs.

    A step that raises is logged and tried again after the interval: one failed
    sweep or tick must never stop the loop. ``on_success`` is called after each
    step that did not raise, ``on_turn`` before each step (so health can tell a
    loop that fails from one that no longer turns). ``pause(seconds)`` waits between
    steps (default: ``shutdown_event.wait``); it may return early, and must once
    shutdown is set. ``first_delay_seconds`` is waited, once the config is
    checked, before the first step.

    Returns:
        ``SHUTDOWN``, or ``INVALID_CONFIG`` at once when ``validate`` refuses the config.
    """
    try:
        validate()
    except ConfigError as error:
        log.warning(f"invalid jobs config; stopping {name} loop", extra={"error": str(error)})
        return RuntimeLoopExit.INVALID_CONFIG
    if first_delay_seconds > 0:
        shutdown_event.wait(first_delay_seconds)
    while not shutdown_event.is_set():
        wait: Optional[float] = None
        if on_turn is not None:
            on_turn()
        try:
            wait = step()
            if on_success is not None:
                on_success()
        except Exception as error:  # noqa: BLE001 - logged; the next interval tries again
            log.warning(f"{name} step failed", extra={"error": str(error)})
        (pause or shutdown_event.wait)(interval_seconds if wait is None else wait)
    return RuntimeLoopExit.SHUTDOWN


class PeriodicThread:
    """:func:`run_periodically` on a thread of its own, for upkeep started with the loops and joined when they stop.

    Args:
        thread_name: the thread's name.
        loop_name: the loop's, in its log lines.
        when_stopped: called on the thread once the loop has stopped (after shutdown, or a refused config).
    """

    def __init__(
        self, thread_name: str, loop_name: str, step: Callable[[], Optional[float]], interval_seconds: float,
        shutdown_event: threading.Event, *, validate: Callable[[], object] = lambda: None,
        first_delay_seconds: float = 0.0, when_stopped: Optional[Callable[[], None]] = None,
    ) -> None:
        self.shutdown_event = shutdown_event
        self._loop = (loop_name, validate, step, interval_seconds, first_delay_seconds)
        self._when_stopped = when_stopped
        self.thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> "PeriodicThread":
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        loop_name, validate, step, interval_seconds, first_delay_seconds = self._loop
        try:
            run_periodically(loop_name, validate, step, interval_seconds, self.shutdown_event,
                             first_delay_seconds=first_delay_seconds)
        finally:
            if self._when_stopped is not None:
                self._when_stopped()
