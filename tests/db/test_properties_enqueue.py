"""Properties of enqueue against a real PostgreSQL (hypothesis, small example counts).

- Any JSON value round-trips: what get_job returns is the payload given, with
  numbers equal as decimals (jsonb keeps a number's decimal value, not its
  float spelling: 1e16 comes back as 10000000000000000).
- The same keyed request twice is the same job, whatever the payload.
- Anything that is not a JSON value jsonb can hold raises job.invalid_payload
  and changes no row.
"""

from __future__ import annotations

import json
import os
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import runledger_sync as rl
from tests.db.test_bad_input_api import table_digest
from tests.support import define

JOB_TYPE = "prop.enqueue"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# jsonb holds neither NUL nor lone surrogates (codec="utf-8" leaves those out).
json_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(json_text, children, max_size=5),
    max_leaves=25,
    # A top-level None is enqueue's "no payload", stored as {} (its documented default).
).filter(lambda value: value is not None)


class Unserialisable:
    pass


# Each draws a valid JSON container with one bad leaf somewhere inside.
bad_leaves = st.sampled_from(
    [float("nan"), float("inf"), -float("inf"), b"bytes", {1, 2}, Unserialisable(), Decimal("1.5"), "nul\x00",
     "lone\ud800", complex(1, 2)]
)
invalid_values = st.recursive(
    bad_leaves,
    lambda children: st.tuples(st.lists(json_scalars, max_size=3), children).map(lambda t: [*t[0], t[1]])
    | st.tuples(json_text, children).map(lambda t: {t[0]: t[1]}),
    max_leaves=6,
)


def as_decimals(value: Any) -> Any:
    """The value with every number as the Decimal its JSON spelling denotes.

    Numbers are tagged, because ``Decimal(1) == True``: a bool turned number (or
    back) must not compare equal.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return ("number", Decimal(repr(value)))
    if isinstance(value, list):
        return [as_decimals(item) for item in value]
    return {key: as_decimals(item) for key, item in value.items()}


@pytest.fixture(scope="module")
def engine(pg_server, template_database):
    # hypothesis reruns the body many times in one test; one database serves them all.
    name = f"rl_prop_enqueue_{os.getpid()}"
    engine = rl.create_engine(pg_server.create_database(name, template=template_database, drop_existing=True))
    define(engine, JOB_TYPE)
    yield engine
    engine.dispose()
    pg_server.drop_database(name)


@SETTINGS
@given(payload=json_values)
def test_any_json_payload_round_trips(engine, payload):
    job = rl.enqueue(engine, JOB_TYPE, payload)

    stored = rl.get_job(engine, job.id)
    assert as_decimals(stored.payload) == as_decimals(payload)
    assert as_decimals(job.payload) == as_decimals(payload)


@SETTINGS
@given(payload=json_values)
# Found by this test: jsonb hands this float back as the int 36028797018963970.
@example(payload={"big": 3.602879701896397e16, "tiny": 5e-324})
def test_the_same_keyed_request_twice_is_one_job(engine, payload):
    # A fresh key per example: hypothesis replays drawn values while shrinking,
    # and one key with two payloads is a genuine conflict.
    key = str(uuid.uuid4())
    first = rl.enqueue(engine, JOB_TYPE, payload, idempotency_key=key)
    second = rl.enqueue(engine, JOB_TYPE, payload, idempotency_key=key)

    assert second.id == first.id
    assert rl.count_jobs(engine, job_type=JOB_TYPE) == len(
        {job.id for job in rl.list_jobs(engine, job_type=JOB_TYPE, limit=100_000)}
    )


@pytest.mark.parametrize(("first", "second"), [(1, True), (0, False), (1, "1"), (1.5, 1.25), ([1], {"0": 1})])
def test_a_different_payload_under_the_same_key_still_conflicts(engine, first, second):
    key = str(uuid.uuid4())
    rl.enqueue(engine, JOB_TYPE, {"x": first}, idempotency_key=key)
    before = table_digest(engine)

    with pytest.raises(rl.IdempotencyConflict):
        rl.enqueue(engine, JOB_TYPE, {"x": second}, idempotency_key=key)

    assert table_digest(engine) == before


@SETTINGS
@given(payload=invalid_values)
def test_any_invalid_payload_raises_invalid_payload_and_writes_nothing(engine, payload):
    before = table_digest(engine)

    with pytest.raises(rl.InvalidPayload) as caught:
        rl.enqueue(engine, JOB_TYPE, payload)

    assert caught.value.code == "job.invalid_payload"
    assert table_digest(engine) == before


@SETTINGS
@given(payload=json_values, room=st.integers(min_value=-3, max_value=3))
def test_the_size_limit_is_exact_in_utf8_bytes_of_compact_json(engine, payload, room):
    size = len(json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8"))
    limit = max(1, size + room)
    before = table_digest(engine)
    if size <= limit:
        job = rl.enqueue(engine, JOB_TYPE, payload, max_payload_bytes=limit)
        assert as_decimals(rl.get_job(engine, job.id).payload) == as_decimals(payload)
    else:
        with pytest.raises(rl.InvalidPayload):
            rl.enqueue(engine, JOB_TYPE, payload, max_payload_bytes=limit)
        assert table_digest(engine) == before
