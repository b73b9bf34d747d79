"""Errors about payload-like values describe their shape, never their content."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync.core import validation as check
from runledger_sync.core.shapes import echo_or_shape, json_problem

SECRET = "sk_live_unit-4a7f"  # noqa: S105 - a marker to search for, not a credential


def cyclic() -> dict:
    value: dict = {"api_key": SECRET}
    value["self"] = value
    return value


def nested(depth: int) -> list:
    value: list = [SECRET]
    for _ in range(depth):
        value = [value]
    return value


# (id, value, the words the message must hold)
REFUSED = [
    ("set-beside-secret", {"api_key": SECRET, "s": {1, 2}}, "got a dict holding a set at key 's'"),
    ("top-level-set", {SECRET}, "got a set"),
    ("bytes", {"api_key": SECRET.encode()}, "a value of type bytes at key 'api_key'"),
    ("object", [SECRET, object()], "a list holding a value of type object at index 1"),
    ("nan-deep", {"a": [SECRET, {"b": float("nan")}]}, "a float that is NaN or infinite at ['a'][1]['b']"),
    ("tuple-key", {"api_key": SECRET, (1, 2): "x"}, "got a dict with a key of type tuple"),
    ("nul-in-secret", {"api_key": SECRET + "\x00"}, "a string containing a NUL character at key 'api_key'"),
    ("surrogate-in-secret", {"api_key": SECRET + "\ud800"}, "a string containing a lone surrogate"),
    ("cycle", cyclic(), "a dict that contains itself at key 'self'"),
    ("too-deep", nested(5_000), "nested more than 500 levels deep"),
]


@pytest.mark.parametrize("name", ["payload", "output", "checkpoint"])
@pytest.mark.parametrize(("value", "words"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_refused_json_names_its_shape_and_never_its_content(name, value, words):
    with pytest.raises(rl.InvalidPayload) as caught:
        check.serialize_json(name, value)

    error = caught.value
    assert error.code == "job.invalid_payload"
    assert error.message.startswith(f"{name} must be ")
    assert words in error.message
    for text in (error.message, str(error), repr(error), repr(error.details), repr(error.value)):
        assert SECRET not in text


def test_a_payload_over_the_size_limit_names_its_size_only():
    with pytest.raises(rl.InvalidPayload) as caught:
        check.serialize_json("payload", {"api_key": SECRET}, max_bytes=10)

    assert caught.value.message == "payload must be at most 10 bytes of JSON, got 31 bytes of JSON"


def test_a_non_scalar_argument_is_described_not_echoed():
    # A payload passed where the job type goes must not be repeated back.
    with pytest.raises(rl.errors.InvalidJobType) as caught:
        check.check_job_type({"api_key": SECRET})

    assert caught.value.message == "job_type must be a string, got a value of type dict"


def test_short_scalar_arguments_are_still_echoed():
    with pytest.raises(rl.InvalidArgument) as caught:
        check.check_int("limit", -1, (1, 100))

    assert caught.value.message == "limit must be an integer from 1 to 100, got -1"
    assert echo_or_shape("email.send") == "'email.send'"
    assert echo_or_shape("x" * 201) == "a str of 201 characters"


def test_progress_of_the_wrong_type_is_named_by_type():
    with pytest.raises(rl.errors.InvalidCompletionProgress) as caught:
        check.check_progress_values(SECRET, None, completion=True)

    assert caught.value.message == "progress_done must be an integer or None, got a str"


def test_json_problem_finds_nothing_in_a_valid_value():
    assert json_problem({"a": [1, 2.5, "x", None, True, {"b": []}], "1": "text keys only"}) is None


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ({1: "a", "1": "b"}, "a dict with a key of type int (JSON keys are strings)"),
        ({"a": {None: "x", "null": "y"}}, "a dict holding a dict with a key of type NoneType (JSON keys are strings) at key 'a'"),
        ([0, 10**5000], "a list holding an int of more than 4300 digits at index 1"),
    ],
    ids=["int-key", "none-key", "huge-int"],
)
def test_json_problem_names_keys_json_would_merge_and_ints_jsonb_cannot_hold(value, phrase):
    assert json_problem(value) == phrase


def test_a_huge_int_argument_is_described_not_written_out():
    # repr() of an int past the interpreter's digit limit raises ValueError itself.
    assert echo_or_shape(10**5000) == "an int of more than 4300 digits"
