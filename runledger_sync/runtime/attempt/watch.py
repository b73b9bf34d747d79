"""The watch of a running attempt: renew its lease, enforce its deadline, notice an operator's cancel.

It runs on the pool thread's timer thread from the first renewal or the
deadline on. Whichever of it and the pool thread decides first takes the
attempt's one outcome (:meth:`Attempt.take`); a lost lease writes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_before_delay, wait_exponential
from tenacity.stop import stop_base

from runledger_sync.core.errors import LeaseOwnerMismatch, RunledgerError
from runledger_sync.core.outcomes import (
    LEASE_OWNER_MISMATCH_CODE,
    MAINTENANCE_LOST,
    LeaseLost,
    timeout_failure,
)
from runledger_sync.core.store_errors import ConnectionFailed
from runledger_sync.logging import get_logger
from runledger_sync.runtime.attempt.state import Attempt, Decider
from runledger_sync.runtime.attempt.cancels import canceled_reason, stop_canceled
from runledger_sync.runtime.attempt.decision import finish
from runledger_sync.store.driver import heartbeat_job

log = get_logger(__name__)

#: How long a renewal still in flight when the lease ran out may take to answer,
#: so the lost attempt is logged with the database's reason when it has one.
LATE_RENEWAL_ANSWER_SECONDS = 1.0
#: Pauses between renewals retried after a lost connection (growing exponentially up to the max).
RENEWAL_RETRY_FIRST_PAUSE_SECONDS = 0.1
RENEWAL_RETRY_MAX_PAUSE_SECONDS = 1.0
#: How often a watchdog waiting on a renewal looks whether the attempt has ended.
RENEWAL_JOIN_STEP_SECONDS = 0.05


def deadline_of(attempt: Attempt, started: float) -> float:
    return started + max(1, attempt.job.timeout_seconds)


def watch(attempt: Attempt, started: float, next_beat: float) -> None:
    """Renew the lease, enforce the deadline, and after the grace period write the timeout."""
    try:
        _watch_until_done(attempt, started, next_beat)
    except Exception as error:  # noqa: BLE001 - logged with the job's fields; the timer goes on
        log.exception("job watch crashed; its lease is no longer renewed",
                      extra=attempt.log_fields | {"error": repr(error)})


def _watch_until_done(attempt: Attempt, started: float, next_beat: float) -> None:
    config = attempt.config
    interval = config.heartbeat_interval
    deadline = deadline_of(attempt, started)
    give_up = deadline + config.timeout_grace_seconds
    while True:
        now = time.monotonic()
        wake_at = min(next_beat, give_up if attempt.deadline_passed else deadline)
        if attempt.wait_decided(max(0.0, wake_at - now)):
            return
        now = time.monotonic()
        if now >= deadline and not attempt.deadline_passed:
            attempt.pass_deadline()
            log.warning("job exceeded its timeout; cancellation requested", extra=attempt.log_fields)
        if attempt.deadline_passed and now >= give_up:
            if attempt.take(Decider.WATCH):
                log.warning(
                    "handler ignored cancellation past its grace period; writing the timeout without it",
                    extra=attempt.log_fields | {"grace_seconds": config.timeout_grace_seconds},
                )
                finish(attempt, timeout_failure())
            return
        if now >= next_beat:
            next_beat = now + interval
            if not _heartbeat(attempt):
                return


def _renew_lease(attempt: Attempt) -> None:
    """Renew the lease, for no longer than the lease itself lasts by the local clock.

    A renewal sent into a dead network can hang far longer than the lease (no
    reply ever comes and nothing times it out). The lease is gone when its TTL
    has passed whether or not the database said so, so the attempt is treated as
    lost then; the renewal itself is left to finish or fail on its own. Until
    then a lost connection is retried: a database restart shorter than the lease
    costs the attempt nothing.
    """
    sent_at = time.monotonic()
    outcome: dict[str, BaseException] = {}

    retrying = Retrying(
        retry=retry_if_exception_type(ConnectionFailed),
        # No retry that could only land after the lease ran out, nor after the attempt ended.
        stop=stop_before_delay(max(0.0, attempt.local_lease_deadline - sent_at))
        | _stop_once_decided(attempt),
        wait=wait_exponential(multiplier=RENEWAL_RETRY_FIRST_PAUSE_SECONDS, max=RENEWAL_RETRY_MAX_PAUSE_SECONDS),
        sleep=_sleep_unless_decided(attempt),
        before_sleep=lambda _state: _count_heartbeat_failure(attempt),
        reraise=True,
    )

    def renew() -> None:
        try:
            retrying(
                heartbeat_job, attempt.engine, **attempt.identity.keywords(),
                event_log=attempt.config.event_log,
                lease_ttl_seconds=attempt.config.lease_ttl_seconds,
                lock_timeout_ms=attempt.config.heartbeat_lock_timeout_ms,
            )
        except BaseException as error:  # noqa: BLE001 - handed to the watchdog, which decides
            outcome["error"] = error

    renewal = threading.Thread(target=renew, name=f"runledger-renew-{attempt.job.id}", daemon=True)
    renewal.start()
    _join_unless_attempt_ended(attempt, renewal, attempt.local_lease_deadline)
    if attempt.is_decided:
        return  # the attempt ended meanwhile; its outcome, not this renewal, decides
    if renewal.is_alive():
        if not attempt.completed_in_transaction:
            # Another worker may claim the job from now on: stop the handler at once,
            # then give the renewal a moment to say why (a row lock released just
            # after expiry answers with the owner mismatch the database decided).
            # _heartbeat replaces this verdict with the final one and logs it.
            attempt.lose_lease(MAINTENANCE_LOST, verdict_pending=True)
        renewal.join(min(attempt.config.heartbeat_interval, LATE_RENEWAL_ANSWER_SECONDS))
        if renewal.is_alive() or "error" not in outcome:
            raise ConnectionFailed(
                f"no answer to the lease renewal of job {attempt.job.id} before its lease ran out")
    if "error" in outcome:
        raise outcome["error"]
    attempt.local_lease_deadline = sent_at + attempt.config.lease_ttl_seconds


def _join_unless_attempt_ended(attempt: Attempt, renewal: threading.Thread, deadline: float) -> None:
    # A handler that returns while a renewal hangs must not wait for the lease to run out.
    while renewal.is_alive() and not attempt.is_decided:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        renewal.join(min(remaining, RENEWAL_JOIN_STEP_SECONDS))


def _heartbeat(attempt: Attempt) -> bool:
    """Renew the lease; on failure mark the attempt lost and ask the handler to stop."""
    try:
        _renew_lease(attempt)
        return True
    except RunledgerError as error:
        if attempt.completed_in_transaction:
            # Since complete_in the handler's transaction holds the row: a heartbeat
            # waits on its lock, then misses once it commits. Neither is a lost
            # lease, and the lock keeps the attempt safe until the handler returns.
            log.debug("heartbeat skipped: the handler owns the completion",
                      extra=attempt.log_fields | {"error": str(error)})
            return True
        if isinstance(error, LeaseOwnerMismatch):
            # The fence also refuses a job an operator canceled: when the cancel's
            # notification did not reach the worker, this is where the handler learns of it.
            reason = canceled_reason(attempt)
            if reason is not None:
                stop_canceled(attempt, reason)
                return False
        _count_heartbeat_failure(attempt)
        if isinstance(error, LeaseOwnerMismatch):
            lost = LeaseLost(LEASE_OWNER_MISMATCH_CODE, "Job lease ownership was lost during processing.")
            log.warning("job heartbeat lost lease ownership", extra=attempt.log_fields | {"error": str(error)})
        else:
            lost = MAINTENANCE_LOST
            log.warning(
                "aborting job because lease heartbeat could not be persisted",
                extra=attempt.log_fields | {"error": str(error)},
            )
    # Lease loss is recorded by where it came from (here), never inferred from a
    # failure code, so a handler's own failure with the same code is persisted.
    attempt.lose_lease(lost)
    if attempt.take(Decider.WATCH):
        finish(attempt, lost)  # writes nothing; logs which kind of lease loss ended the attempt
    return False


def _sleep_unless_decided(attempt: Attempt) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        attempt.wait_decided(seconds)  # woken early, the stop condition then ends the retries

    return sleep


class _stop_once_decided(stop_base):
    """Stops retrying a renewal once the attempt's outcome is taken: nobody needs its lease then."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._attempt.is_decided


def _count_heartbeat_failure(attempt: Attempt) -> None:
    if attempt.observer is not None:
        attempt.observer.heartbeat_failed(attempt.job.job_type)

