"""Bad input refused before any I/O: the validation rules, URLs, registry and config.

Database-backed tables live in tests/db/test_bad_input_api.py and
tests/db/test_bad_input_cli.py; these need no server. The xfails are known gaps
in modules this suite may not change; each reason says where.
"""

from __future__ import annotations

import json

import pytest

import runledger_sync as rl
from runledger_sync.core import validation as check

SURROGATE = "\udcff"


@pytest.mark.parametrize(
    "value",
    [
        {"s": "\\u0000"},  # a backslash and "u0000": text, not a NUL
        {"s": "\\\\u0000"},
        {"s": "tab\there", "quote": '"', "backslash": "\\"},
        {"emoji": "😀", "cjk": "漢字", "zero-width": "\u200b"},
        [0, -0.0, 1e308, 5e-324, 2**200, True, None],
    ],
    ids=["spelled-nul", "spelled-nul-2", "escapes", "unicode", "numbers"],
)
def test_json_that_jsonb_can_hold_is_accepted_unchanged(value):
    assert json.loads(check.serialize_json("payload", value)) == value


@pytest.mark.parametrize(
    "value",
    [
        "\x00",
        {"a": "x\x00"},
        {"\x00": 1},
        {"s": "\\\x00"},  # a backslash, then a real NUL
        "lone " + SURROGATE,
        {SURROGATE: 1},
        ["\ud800\ud800"],
        float("nan"),
        {"x": float("inf")},
        b"bytes",
        {1, 2},
        object(),
    ],
    ids=["nul", "nul-in-value", "nul-in-key", "backslash-then-nul", "surrogate", "surrogate-key", "two-highs",
         "nan", "inf", "bytes", "set", "object"],
)
def test_values_jsonb_cannot_hold_are_invalid_payload(value):
    with pytest.raises(rl.InvalidPayload) as caught:
        check.serialize_json("payload", value)
    assert caught.value.code == "job.invalid_payload"


def test_nesting_deeper_than_python_can_encode_is_invalid_payload_not_recursion_error():
    value: list = []
    for _ in range(50_000):
        value = [value]
    with pytest.raises(rl.InvalidPayload) as caught:
        check.serialize_json("payload", value)
    assert "nested" in caught.value.message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (None, "a string"),
        (b"bytes", "a string"),
        (7, "a string"),
        ("", "non-blank"),
        ("\t \n", "non-blank"),
        ("x" * 256, "at most 255 characters"),
        ("a\x00b", "free of NUL"),
        ("a" + SURROGATE, "no lone surrogates"),
    ],
)
def test_text_arguments_are_refused_with_the_reason(value, fragment):
    with pytest.raises(rl.InvalidArgument) as caught:
        check.check_text("organization_id", value, max_length=255)
    assert fragment in caught.value.message
    assert caught.value.argument == "organization_id"


def test_long_text_is_not_echoed_whole_in_the_message():
    with pytest.raises(rl.InvalidArgument) as caught:
        check.check_text("reason", "r" * 1_000_000, max_length=255)
    assert len(caught.value.message) < 300


@pytest.mark.parametrize("url", [42, b"postgresql://x/y", object(), "", "   ", "http://example.com/", "sqlite:///x"],
                         ids=["int", "bytes", "object", "empty", "blank", "http", "sqlite"])
def test_create_engine_refuses_what_is_not_a_postgresql_url(url):
    with pytest.raises(rl.ConfigError) as caught:
        rl.create_engine(url)
    assert caught.value.code == "config.invalid"


@pytest.mark.parametrize("job_type", ["a\x00b", "t." + SURROGATE])
def test_registration_refuses_a_job_type_the_database_cannot_store(job_type):
    with pytest.raises(rl.RegistrationError):
        rl.JobRegistry().job(job_type)(lambda ctx, payload: None)


@pytest.mark.parametrize(
    "overrides",
    [{"worker_id": "w\x00"}, {"worker_id": "w" + SURROGATE}, {"worker_id": "w" * 256}, {"job_types": ("a\x00",)}],
    ids=["worker-id-nul", "worker-id-surrogate", "worker-id-too-long", "job-type-nul"],
)
def test_config_validation_refuses_values_the_store_would_refuse(overrides):
    with pytest.raises(rl.ConfigError):
        rl.JobsConfig(**overrides).validate()


def test_check_schema_given_a_url_string_raises_a_coded_error_without_its_password():
    with pytest.raises(rl.InvalidArgument) as caught:
        rl.check_schema("postgresql://app:hunter2@127.0.0.1:1/app")
    assert caught.value.code == "job.invalid_argument"
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("bind", ["postgresql://app:pw@127.0.0.1:1/app", None], ids=["url-string", "none"])
def test_migrate_given_something_other_than_an_engine_is_invalid_argument(bind):
    with pytest.raises(rl.RunledgerError) as caught:
        rl.migrate(bind)
    assert caught.value.code == "job.invalid_argument"


@pytest.mark.parametrize(("value", "size"), [("abc", 5), ("é😀", 8), ({"k": ["é"]}, 12), (2**70, 22)],
                         ids=["ascii", "non-ascii", "nested-non-ascii", "big-int"])
def test_serialize_json_bounds_the_utf8_bytes_not_the_characters(value, size):
    assert len(check.serialize_json("payload", value, max_bytes=size).encode("utf-8")) == size
    with pytest.raises(rl.InvalidPayload, match=f"got {size} bytes of JSON"):
        check.serialize_json("payload", value, max_bytes=size - 1)


@pytest.mark.parametrize("value", [{1: "a"}, [{"x": {2: "b"}}], (0, {None: 1}), 10**5000],
                         ids=["int-key", "nested-int-key", "tuple-none-key", "int-too-long"])
def test_serialize_json_refuses_in_containers_what_jsonb_would_lose(value):
    with pytest.raises(rl.InvalidPayload):
        check.serialize_json("payload", value)
