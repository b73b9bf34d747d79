"""The retry delay formula and heartbeat cadence, pinned to the seed's numbers."""

from __future__ import annotations

import uuid

import pytest

from runledger_sync.core.backoff import (
    compute_retry_delay_ms,
    compute_transient_retry_delay_ms,
    heartbeat_interval_seconds,
)
from runledger_sync.core.outcomes import TRANSIENT_FAILURE_BUDGET

# int % 1000 == 456, so the jitter is 456 - 500 = -44 ms.
JOB_ID = uuid.UUID(int=7_000_456)


@pytest.mark.parametrize(
    ("attempt", "expected_ms"),
    [
        (0, 9_956),  # clamped up to attempt 1
        (1, 9_956),
        (2, 19_956),
        (3, 39_956),
        (4, 79_956),
        (5, 159_956),
        (6, 299_956),  # 320 s capped to 300 s
        (7, 299_956),
        (8, 299_956),
        (9, 299_956),
        (10, 299_956),
        (11, 299_956),  # clamped down to attempt 10
        (12, 299_956),
    ],
)
def test_retry_delay_matches_seed_schedule(attempt, expected_ms):
    assert compute_retry_delay_ms(attempt, JOB_ID) == expected_ms


@pytest.mark.parametrize(
    ("failures_in_a_row", "expected_ms"),
    [(0, 1_000), (1, 1_000), (2, 1_956), (3, 3_956), (4, 7_956), (5, 15_956), (6, 31_956), (7, 59_956), (50, 59_956)],
)
def test_transient_retry_delay_doubles_from_one_second_to_a_minute(failures_in_a_row, expected_ms):
    # The first retry's 956 ms is lifted to the 1 s floor.
    assert compute_transient_retry_delay_ms(failures_in_a_row, JOB_ID) == expected_ms


def test_a_full_transient_budget_outlasts_a_database_restart_of_several_minutes():
    total_ms = sum(compute_transient_retry_delay_ms(n, JOB_ID) for n in range(1, TRANSIENT_FAILURE_BUDGET + 1))
    assert 14 * 60_000 < total_ms < 16 * 60_000


def test_negative_attempt_is_clamped_to_first_retry():
    assert compute_retry_delay_ms(-3, JOB_ID) == 9_956


def test_huge_attempt_stays_capped():
    assert compute_retry_delay_ms(10_000, JOB_ID) == 299_956


@pytest.mark.parametrize(
    ("remainder", "jitter_ms"),
    [(0, -500), (499, -1), (500, 0), (501, 1), (999, 499)],
)
def test_jitter_is_job_id_int_mod_1000_minus_500(remainder, jitter_ms):
    job_id = uuid.UUID(int=123 * 1000 + remainder)
    assert compute_retry_delay_ms(1, job_id) == 10_000 + jitter_ms
    assert compute_retry_delay_ms(6, job_id) == 300_000 + jitter_ms


def test_jitter_uses_the_full_128_bit_big_endian_value():
    # UUID.int is the unsigned big-endian value (Rust as_u128): 123 here, while the
    # low 64 bits alone would give 555 and the little-endian bytes 643.
    job_id = uuid.UUID("0190b6c2-5d3e-7a41-9f2b-3c4d5e6f7a8b")
    assert compute_retry_delay_ms(1, job_id) == 10_000 + 123 - 500


def test_same_job_gets_same_delay_and_jobs_differ():
    a = uuid.UUID("0190b6c2-1111-7000-8000-000000000001")
    b = uuid.UUID("0190b6c2-1111-7000-8000-000000000002")
    assert compute_retry_delay_ms(3, a) == compute_retry_delay_ms(3, a)
    assert compute_retry_delay_ms(3, a) - compute_retry_delay_ms(3, b) == -1


def test_delay_never_goes_below_the_floor():
    # With a 5 s base the 1000 ms floor is unreachable; the smallest delay is
    # the first retry with the most negative jitter.
    delays = [
        compute_retry_delay_ms(attempt, uuid.UUID(int=r)) for attempt in range(-2, 14) for r in range(1000)
    ]
    assert min(delays) == 9_500
    assert max(delays) == 300_499
    assert all(d >= 1_000 for d in delays)


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [(60, 20), (60.0, 20), (1, 1), (2, 1), (3, 1), (10, 3), (30, 10), (0, 1), (-5, 1)],
)
def test_heartbeat_interval_is_a_third_of_the_lease_at_least_one_second(ttl, expected):
    assert heartbeat_interval_seconds(ttl) == expected
