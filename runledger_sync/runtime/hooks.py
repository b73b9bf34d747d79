"""Run a handler's ``on_dead_letter`` hook in its own thread, bounded by a timeout."""

from __future__ import annotations

import threading
from typing import Any

from runledger_sync.core.types import JobContext, JobDeadLetterInfo
from runledger_sync.handlers import JobHandler
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
    failure: list[BaseException] = []

    def call() -> None:
        try:
            handler.on_dead_letter(context, payload, info)
        except BaseException as exc:  # noqa: BLE001 - reported below, never propagated
            failure.append(exc)

    thread = threading.Thread(target=call, name=f"runledger-hook-{context.job_id}", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    if thread.is_alive():
        log.warning(
            "dead-letter hook timed out; continuing worker job task",
            extra=log_fields | {"timeout_ms": int(timeout_seconds * 1000)},
        )
        return False
    if failure:
        log.warning(
            "dead-letter hook panicked; continuing worker job task",
            extra=log_fields | {"error": f"{type(failure[0]).__name__}: {failure[0]}"},
            exc_info=failure[0],
        )
        return False
    return True
