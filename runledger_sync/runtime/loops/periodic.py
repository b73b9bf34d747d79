"""The shape the reaper and scheduler loops share: check the config, then one step per interval until shutdown."""

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
) -> RuntimeLoopExit:
    """Run ``step`` until shutdown, waiting what it returns (None: ``interval_seconds``) between runs.

    A step that raises is logged and tried again after the interval: one failed
    sweep or tick must never stop the loop. ``on_success`` is called after each
    step that did not raise, ``on_turn`` before each step (so health can tell a
    loop that fails from one that no longer turns). ``pause(seconds)`` waits between
    steps (default: ``shutdown_event.wait``); it may return early, and must once
    shutdown is set.

    Returns:
        ``SHUTDOWN``, or ``INVALID_CONFIG`` at once when ``validate`` refuses the config.
    """
    try:
        validate()
    except ConfigError as error:
        log.warning(f"invalid jobs config; stopping {name} loop", extra={"error": str(error)})
        return RuntimeLoopExit.INVALID_CONFIG
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
