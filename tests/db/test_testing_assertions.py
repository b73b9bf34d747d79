"""testing.enqueued_jobs, assert_enqueued and refute_enqueued, and what their failures say."""

from __future__ import annotations

import re

import pytest

import runledger_sync as rl
from runledger_sync import testing
from runledger_sync.core.errors import InvalidArgument
from tests.db.test_docs import marked

pytest_plugins = ["pytester"]

#: An application's tests whose assertions fail, run by an inner pytest session (pytester).
FAILING_ASSERTIONS = '''
import os

import runledger_sync as rl
from runledger_sync import testing

engine = rl.create_engine(os.environ["ASSERTIONS_TEST_URL"])

def test_nothing_was_enqueued():
    testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"})

def test_something_was_enqueued():
    rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    testing.refute_enqueued(engine, "email.send")
'''


@pytest.fixture
def registry(engine):
    registry = rl.JobRegistry()
    for job_type in ("email.send", "reports.export"):
        registry.job(job_type)(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    return registry


def test_enqueued_jobs_lists_pending_jobs_oldest_first_filtered_by_type_and_fields(engine, registry):
    first = rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    second = rl.enqueue(engine, "email.send", {"to": "d@e.f"}, priority=3)
    report = rl.enqueue(engine, "reports.export", {"kind": "daily"}, organization_id="acme")

    assert [j.id for j in testing.enqueued_jobs(engine)] == [first.id, second.id, report.id]
    assert [j.id for j in testing.enqueued_jobs(engine, "email.send")] == [first.id, second.id]
    assert [j.id for j in testing.enqueued_jobs(engine, "email.send", priority=3)] == [second.id]
    assert [j.id for j in testing.enqueued_jobs(engine, organization_id="acme")] == [report.id]
    assert [j.id for j in testing.enqueued_jobs(engine, payload={"to": "d@e.f"})] == [second.id]


def test_enqueued_jobs_counts_only_pending_jobs_unless_a_status_is_given(engine, registry):
    ran = rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    testing.drain(engine, registry)
    waiting = rl.enqueue(engine, "email.send", {"to": "d@e.f"})

    assert [j.id for j in testing.enqueued_jobs(engine, "email.send")] == [waiting.id]
    assert [j.id for j in testing.enqueued_jobs(engine, "email.send", status="SUCCEEDED")] == [ran.id]
    assert [j.id for j in testing.enqueued_jobs(engine, "email.send", status=rl.JobStatus.SUCCEEDED)] == [ran.id]
    assert [j.id for j in testing.enqueued_jobs(engine, "email.send", status=None)] == [ran.id, waiting.id]


def test_a_payload_filter_matches_by_containment_nested_objects_too(engine, registry):
    job = rl.enqueue(engine, "email.send", {"to": "a@b.c", "meta": {"lang": "en", "tags": ["x", "y"]}, "n": 1})

    for contained in ({}, {"to": "a@b.c"}, {"meta": {"lang": "en"}}, {"meta": {"tags": ["x", "y"]}, "n": 1}):
        assert testing.assert_enqueued(engine, "email.send", contained).id == job.id
    for other in ({"to": "x"}, {"meta": {"lang": "fr"}}, {"meta": {"tags": ["x"]}}, {"missing": None}, {"n": True}):
        testing.refute_enqueued(engine, "email.send", other)


def test_assert_enqueued_returns_the_oldest_match(engine, registry):
    first = rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    assert testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"}) == first


def test_a_failed_assert_enqueued_shows_what_was_enqueued_instead_and_what_differs(engine, registry):
    wrong_to = rl.enqueue(engine, "email.send", {"to": "d@e.f"}, priority=1)
    wrong_priority = rl.enqueue(engine, "email.send", {"to": "a@b.c"}, priority=7)
    report = rl.enqueue(engine, "reports.export", {"kind": "daily"})

    with pytest.raises(AssertionError) as raised:
        testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"}, priority=3)

    message = str(raised.value)
    assert message.splitlines()[0] == (
        "Expected a pending job of type 'email.send' with payload containing {'to': 'a@b.c'} and priority=3; "
        "none is enqueued."
    )
    assert "2 pending jobs of type 'email.send' instead:" in message
    assert f"  {wrong_to.id} PENDING payload={{'to': 'd@e.f'}}  (differs in: payload, priority=1)" in message
    assert f"  {wrong_priority.id} PENDING payload={{'to': 'a@b.c'}}  (differs in: priority=7)" in message
    assert message.splitlines()[-1] == f"Other pending jobs: reports.export x1 ({report.id})"


def test_a_failed_assert_enqueued_says_when_nothing_at_all_is_enqueued(engine, registry):
    with pytest.raises(AssertionError) as raised:
        testing.assert_enqueued(engine, "email.send")
    assert str(raised.value).splitlines() == [
        "Expected a pending job of type 'email.send'; none is enqueued.",
        "No pending job of type 'email.send' is enqueued.",
        "No other pending jobs are enqueued.",
    ]


def test_a_failed_assertion_in_a_users_test_shows_the_users_line_and_not_the_helpers_source(
        engine, registry, pytester, monkeypatch):
    monkeypatch.setenv("ASSERTIONS_TEST_URL", engine.url.render_as_string(hide_password=False))
    pytester.makepyfile(test_app=FAILING_ASSERTIONS)

    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:runledger_sync.testing.pytest_plugin")

    result.assert_outcomes(failed=2)
    output = result.stdout.str()
    assert 'testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"})' in output
    assert 'testing.refute_enqueued(engine, "email.send")' in output
    assert "E       AssertionError: Expected a pending job of type 'email.send'" in output
    assert "E       AssertionError: Expected no pending job of type 'email.send'" in output
    assert "testing/assertions.py" not in output and "raise AssertionError" not in output


def test_a_failed_assertion_cuts_long_payloads(engine, registry):
    rl.enqueue(engine, "email.send", {"body": "x" * 1000})
    with pytest.raises(AssertionError) as raised:
        testing.assert_enqueued(engine, "email.send", {"body": "y"})
    shown = re.search(r"payload=(\{.*?)  \(differs", str(raised.value)).group(1)
    assert len(shown) == testing.assertions.SHOWN_PAYLOAD_CHARS and shown.endswith("...")


def test_refute_enqueued_passes_when_nothing_matches_and_lists_the_matches_when_some_do(engine, registry):
    testing.refute_enqueued(engine, "email.send")
    job = rl.enqueue(engine, "email.send", {"to": "a@b.c"}, queue="default")
    testing.refute_enqueued(engine, "email.send", {"to": "x@y.z"})
    testing.refute_enqueued(engine, "reports.export")

    with pytest.raises(AssertionError) as raised:
        testing.refute_enqueued(engine, "email.send", {"to": "a@b.c"}, queue="default")
    assert str(raised.value).splitlines() == [
        "Expected no pending job of type 'email.send' with payload containing {'to': 'a@b.c'} and queue='default'; found 1:",
        f"  {job.id} PENDING payload={{'to': 'a@b.c'}}",
    ]


def test_assertions_follow_the_drain(engine, registry):
    rl.enqueue(engine, "email.send", {"to": "a@b.c"})
    testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"})
    testing.drain(engine, registry)
    testing.refute_enqueued(engine, "email.send")
    testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"}, status="SUCCEEDED")


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda engine: testing.enqueued_jobs(engine, colour="red"), "colour"),
        (lambda engine: testing.assert_enqueued(engine, "email.send", queu="x"), "queu"),
        (lambda engine: testing.refute_enqueued(engine, "email.send", status="DONE"), "status"),
    ],
)
def test_a_malformed_filter_is_refused_with_a_code(engine, call, argument):
    with pytest.raises(InvalidArgument) as raised:
        call(engine)
    assert raised.value.code == "job.invalid_argument"
    assert argument in str(raised.value)


def test_the_failure_message_shown_in_the_documentation_is_the_one_raised(engine, registry):
    registry.job("crm.sync")(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    rl.enqueue(engine, "crm.sync", {"email": "alan@example.test", "source": "import"}, priority=7)

    with pytest.raises(AssertionError) as raised:
        testing.assert_enqueued(engine, "crm.sync", {"email": "ada@example.test"}, priority=3)

    shown = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", str(raised.value))
    assert shown + "\n" == marked("testing-failure-message", "text")
