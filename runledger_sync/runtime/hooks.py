"""Run the application's hooks (a handler's ``on_dead_letter``, the registry's ``on_failure``) in threads, bounded by a timeout."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from runledger_sync.core.types import JobContext, JobDeadLetterInfo
from runledger_sync.handlers import FailureHook, JobHandler
from runledger_sync.logging import get_logger

log = get_logger(__name__)


def run_dead_letter_hook(
    handler: JobHandler,
    context: JobContext,
    payload: Any,
    info: JobDeadLetterInfo,
    *,
    timeout_seconds: float,
    log_fields: dict[str, Any],
) -> bool:
    """Call the hook and wait at most ``timeout_seconds``; return True if it finished cleanly.

    A hook that raises or hangs is logged and otherwise ignored: the dead letter
    is already committed and nothing it does can change that. A hung hook's
    thread is a daemon, so it cannot keep the process alive.
    """
    return _run_bounded("dead-letter hook", [lambda: handler.on_dead_letter(context, payload, info)], context,
                        timeout_seconds=timeout_seconds, log_fields=log_fields)


def run_failure_hooks(
    hooks: Sequence[FailureHook],
    context: JobContext,
    payload: Any,
    exception: BaseException,
    *,
    timeout_seconds: float,
    log_fields: dict[str, Any],
) -> bool:
    """Call every ``hook(context, payload, exception)`` at once and wait at most ``timeout_seconds`` for them all.

    Returns True if every hook finished cleanly; one that raises or hangs is
    logged and otherwise ignored, as a dead-letter hook is.
    """
    return _run_bounded("failure hook", [_bound(hook, context, payload, exception) for hook in hooks], context,
                        timeout_seconds=timeout_seconds, log_fields=log_fields)


def _bound(hook: FailureHook, context: JobContext, payload: Any, exception: BaseException) -> Callable[[], None]:
    return lambda: hook(context, payload, exception)


def _run_bounded(
    what: str, calls: Sequence[Callable[[], None]], context: JobContext, *, timeout_seconds: float,
    log_fields: dict[str, Any],
) -> bool:
    failures: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - reported below, never propagated
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(call,), name=f"runledger-hook-{context.job_id}", daemon=True)
               for call in calls]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    clean = True
    if any(thread.is_alive() for thread in threads):
        clean = False
        log.warning(
            f"{what} timed out; continuing worker job task",
            extra=log_fields | {"timeout_ms": int(timeout_seconds * 1000)},
        )
    for failure in list(failures):
        clean = False
        log.warning(
            f"{what} panicked; continuing worker job task",
            extra=log_fields | {"error": f"{type(failure).__name__}: {failure}"},
            exc_info=failure,
        )
    return clean
