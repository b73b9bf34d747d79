"""The application's jobs, tested with runledger_sync.testing on a database of each test's own."""

from __future__ import annotations

import runledger_sync as rl
from runledger_sync import testing

from accounts.jobs import sign_up


def test_signing_up_enqueues_the_welcome_email(runledger_engine, registry):
    sign_up(runledger_engine, "ada@example.test")

    testing.assert_enqueued(runledger_engine, "email.welcome", {"to": "ada@example.test"}, queue="mail")
    testing.refute_enqueued(runledger_engine, "crm.sync")


def test_draining_sends_the_email_and_then_syncs_the_crm(runledger_engine, registry, outbox):
    sign_up(runledger_engine, "ada@example.test")
    sign_up(runledger_engine, "alan@example.test")

    result = testing.drain(runledger_engine, registry)

    assert result.by_outcome == {"succeeded": 4}
    assert [mail["to"] for mail in outbox] == ["ada@example.test", "alan@example.test"]
    assert testing.enqueued_jobs(runledger_engine) == []


def test_run_job_sends_one_welcome_email_now(runledger_engine, registry, outbox):
    job = testing.run_job(runledger_engine, registry, "email.welcome", {"to": "grace@example.test"})

    assert job.status is rl.JobStatus.SUCCEEDED
    assert outbox == [{"to": "grace@example.test", "subject": "Welcome!"}]
    testing.assert_enqueued(runledger_engine, "crm.sync", {"email": "grace@example.test"})


def test_a_bouncing_address_is_retried_then_dead_lettered(runledger_engine, registry, outbox):
    job = sign_up(runledger_engine, "nobody@bounce.test")

    result = testing.drain(runledger_engine, registry, include_scheduled=True)

    assert result.by_outcome == {"retried": 2, "dead_lettered": 1}
    assert rl.get_job(runledger_engine, job.id).last_error_code == "smtp.bounce"
    assert outbox == []


def test_each_test_starts_from_an_empty_queue(runledger_engine):
    assert testing.enqueued_jobs(runledger_engine, status=None) == []
