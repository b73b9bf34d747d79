"""The completion-progress rule as a property (spec section 4, "Complete success" step 1).

A handler's progress is valid iff each given value is a non-negative integer that
fits the bigint column, and done <= total when both are given. The same rule
guards progress updates (``job.invalid_progress``) and completions
(``job.invalid_completion_progress``); the runtime's own wording comes from
``completion_progress_problem``.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger_sync.core.errors import InvalidCompletionProgress, InvalidProgress
from runledger_sync.core.validation import check_progress_values, completion_progress_problem

BIGINT_MAX = 2**63 - 1

counts = st.none() | st.integers(min_value=-5, max_value=50) | st.sampled_from([BIGINT_MAX, BIGINT_MAX + 1, -(2**63)])
not_ints = st.sampled_from([True, False, 1.0, "3", [1], float("nan")])


def expected_valid(done: Optional[int], total: Optional[int]) -> bool:
    for value in (done, total):
        if value is not None and not 0 <= value <= BIGINT_MAX:
            return False
    return done is None or total is None or done <= total


@settings(max_examples=200, deadline=None)
@given(done=counts, total=counts, completion=st.booleans())
def test_progress_is_refused_exactly_when_the_rule_says(done, total, completion):
    error = InvalidCompletionProgress if completion else InvalidProgress
    if expected_valid(done, total):
        check_progress_values(done, total, completion=completion)
    else:
        with pytest.raises(error) as caught:
            check_progress_values(done, total, completion=completion)
        assert caught.value.code == error.code


@settings(max_examples=100, deadline=None)
@given(done=st.integers(min_value=-5, max_value=50) | st.none(), total=st.integers(min_value=-5, max_value=50) | st.none())
def test_the_runtime_wording_agrees_with_the_rule(done, total):
    problem = completion_progress_problem(done, total)
    assert (problem is None) == expected_valid(done, total)
    if problem is not None:
        assert problem.startswith("Handler returned invalid success progress: ")


@settings(max_examples=50, deadline=None)
@given(value=not_ints, other=counts, position=st.sampled_from(["done", "total"]), completion=st.booleans())
def test_values_that_are_not_plain_ints_are_refused(value: Any, other, position, completion):
    done, total = (value, other) if position == "done" else (other, value)
    with pytest.raises((InvalidCompletionProgress, InvalidProgress)) as caught:
        check_progress_values(done, total, completion=completion)
    assert caught.value.code == ("job.invalid_completion_progress" if completion else "job.invalid_progress")
