"""``runledger-sync prune``: it prints what it deleted, --dry-run deletes nothing, bad input exits 2 with a code."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

import runledger_sync as rl
from tests.support import define, scalar


@pytest.fixture
def db(engine, monkeypatch):
    """Two succeeded jobs 10 days old, one canceled 10 days old, one succeeded an hour ago, one pending."""
    monkeypatch.delenv("RUNLEDGER_RETENTION", raising=False)
    define(engine)
    for status, age in (("SUCCEEDED", "10 days"), ("SUCCEEDED", "10 days"), ("CANCELED", "10 days"),
                        ("SUCCEEDED", "1 hour")):
        job_id = rl.enqueue(engine, "test.job", {}).id
        with engine.begin() as connection:
            connection.execute(text("UPDATE job_queue SET status = :status, "
                                    "finished_at = now() - CAST(:age AS interval) WHERE id = :id"),
                               {"status": status, "age": age, "id": job_id})
    rl.enqueue(engine, "test.job", {})
    return engine


def jobs_left(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


def test_prune_dry_run_prints_the_counts_and_deletes_nothing(db, run):
    code, out, err = run("prune", "--dry-run")

    assert code == 0, err
    assert "would delete" in out and "jobs SUCCEEDED" in out
    assert jobs_left(db) == 5
    _, json_out, _ = run("prune", "--dry-run", "--json")
    counts = json.loads(json_out)
    assert counts["jobs"] == {"SUCCEEDED": 2, "CANCELED": 1} and counts["dry_run"] is True


def test_prune_by_status_and_age_deletes_only_those(db, run):
    code, out, err = run("prune", "--status", "canceled", "--json")

    assert code == 0, err
    assert json.loads(out)["jobs"] == {"CANCELED": 1}
    assert jobs_left(db) == 4

    code, out, err = run("prune", "--older-than", "30m", "--batch-size", "1", "--json")

    assert code == 0, err
    result = json.loads(out)
    assert result["jobs"] == {"SUCCEEDED": 3} and result["batches"] == 3
    assert jobs_left(db) == 1  # the pending job


def test_prune_follows_runledger_retention(db, run, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_RETENTION", "off")
    code, out, err = run("prune")

    assert code == 0, err
    assert "retention: off" in out and jobs_left(db) == 5


@pytest.mark.parametrize("arguments, argument", [
    (("--older-than", "soon"), "--older-than"),
    (("--older-than", "0d"), "--older-than"),
    (("--status", "pending"), "--status"),
    (("--batch-size", "many"), "--batch-size"),
    (("--batch-size", "0"), "batch_size"),
])
def test_bad_input_is_refused_with_a_code_and_exit_2(db, run, arguments, argument):
    code, out, err = run("prune", *arguments)

    assert code == 2
    assert err.startswith("error: job.invalid_argument: ") and argument in err, err
    assert jobs_left(db) == 5
