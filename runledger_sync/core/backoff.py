"""The retry delay formulas and the heartbeat cadence of the seed worker.

All are pure functions of their arguments, so every worker on every machine
computes the same delay for the same failed attempt.
"""

from __future__ import annotations

from uuid import UUID

#: The delay of the first retry is ``RETRY_BASE_MS * 2``.
RETRY_BASE_MS = 5_000
#: No policy delay is longer than this (five minutes).
RETRY_CAP_MS = 300_000
#: No policy delay is shorter than this. With the base above the floor is never
#: reached; the seed keeps it as a guard, and so do we.
RETRY_FLOOR_MS = 1_000
#: Attempts above this number all get the capped delay.
RETRY_MAX_EXPONENT = 10
#: The per-job jitter spans ``[-RETRY_JITTER_MS, RETRY_JITTER_MS)``.
RETRY_JITTER_MS = 500


def compute_retry_delay_ms(attempt: int, job_id: UUID) -> int:
    """Compute the policy delay before a failed attempt is retried.

    The delay doubles per attempt from 10 s up to a 300 s cap, plus a jitter
    that depends only on the job id, so retries of many jobs that failed
    together spread out while each job's own schedule stays reproducible:

    =========  ===============
    attempt    delay
    =========  ===============
    <= 1       10 s  +/- 500 ms
    2          20 s  +/- 500 ms
    3          40 s  +/- 500 ms
    4          80 s  +/- 500 ms
    5          160 s +/- 500 ms
    >= 6       300 s +/- 500 ms
    =========  ===============

    Exactly: ``a = clamp(attempt, 1, 10)``, ``capped = min(5000 * 2**a, 300000)``,
    ``jitter = (job_id.int % 1000) - 500``, result ``max(capped + jitter, 1000)``.
    ``job_id.int`` is the UUID as an unsigned 128-bit big-endian integer, the
    same number the Rust seed's ``Uuid::as_u128`` gives, so both ports agree.

    Args:
        attempt: The attempt that just failed (1 for the first claim).
        job_id: The job's id; it seeds the jitter.

    Returns:
        The delay in milliseconds, at least 1000.
    """
    exponent = min(max(attempt, 1), RETRY_MAX_EXPONENT)
    # A shift is ``* 2**exponent`` for an exponent of 0 or more (clamped above), and is typed int,
    # where ``int ** int`` is typed Any because a negative exponent would give a float.
    capped = min(RETRY_BASE_MS << exponent, RETRY_CAP_MS)
    jitter = job_id.int % (2 * RETRY_JITTER_MS) - RETRY_JITTER_MS
    return max(capped + jitter, RETRY_FLOOR_MS)


#: The delay of the first retry after a transient infrastructure error.
TRANSIENT_RETRY_BASE_MS = 1_000
#: No transient retry waits longer than this (one minute).
TRANSIENT_RETRY_CAP_MS = 60_000


def compute_transient_retry_delay_ms(failures_in_a_row: int, job_id: UUID) -> int:
    """Compute the delay before retrying an attempt that hit a transient infrastructure error.

    A lost connection often comes back within seconds, so the first retries are
    quick; the delay then doubles to a one-minute cap, so that the retries of a
    full budget (:data:`runledger_sync.core.outcomes.TRANSIENT_FAILURE_BUDGET`,
    20) span about 15 minutes, longer than a database restart takes. The jitter
    is the one of :func:`compute_retry_delay_ms`:

    =================  ======================
    failures in a row  delay
    =================  ======================
    <= 1               1 s  (+ up to 500 ms)
    2                  2 s  +/- 500 ms
    3                  4 s  +/- 500 ms
    4                  8 s  +/- 500 ms
    5                  16 s +/- 500 ms
    6                  32 s +/- 500 ms
    >= 7               60 s +/- 500 ms
    =================  ======================

    Exactly: ``n = clamp(failures_in_a_row, 1, 7)``, ``capped = min(1000 * 2**(n - 1), 60000)``,
    ``jitter = (job_id.int % 1000) - 500``, result ``max(capped + jitter, 1000)``.

    Args:
        failures_in_a_row: How many attempts in a row, this one included, ended
            on a transient error (1 for the first).
        job_id: The job's id; it seeds the jitter.

    Returns:
        The delay in milliseconds, at least 1000.
    """
    doublings = min(max(failures_in_a_row, 1), 7) - 1
    capped = min(TRANSIENT_RETRY_BASE_MS << doublings, TRANSIENT_RETRY_CAP_MS)  # a shift for the reason above
    jitter = job_id.int % (2 * RETRY_JITTER_MS) - RETRY_JITTER_MS
    return max(capped + jitter, RETRY_FLOOR_MS)


def heartbeat_interval_seconds(lease_ttl_seconds: float) -> int:
    """Compute how often a running job renews its lease.

    A third of the lease, so two beats can be lost before the lease expires;
    never less than one second. TTL 60 => 20 s, TTL 10 => 3 s, TTL 1 or 2 => 1 s.

    Args:
        lease_ttl_seconds: The lease length the job was claimed with.

    Returns:
        Whole seconds between heartbeats, at least 1.
    """
    return max(1, max(1, int(lease_ttl_seconds)) // 3)
