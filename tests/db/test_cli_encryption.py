"""The command line and the dashboard with keys: rotate, and a job whose key the process lacks."""

from __future__ import annotations

import base64
import json
import os
from typing import Iterator

import pytest

import runledger_sync as rl
from runledger_sync.core.encryption import active_encryption
from tests.support import JOB_TYPE, define, scalar

KEY = os.urandom(32)
OTHER = os.urandom(32)


@pytest.fixture(autouse=True)
def restore_encryption() -> Iterator[None]:
    before = active_encryption()
    yield
    rl.configure_encryption(before)


def use_keys(monkeypatch, **keys: bytes) -> None:
    monkeypatch.setenv("RUNLEDGER_ENCRYPTION_KEYS",
                       ",".join(f"{key_id}:{base64.b64encode(key).decode()}" for key_id, key in keys.items()))
    monkeypatch.setenv("RUNLEDGER_ENCRYPTION_CURRENT", next(iter(keys)))


def test_rotate_seals_the_clear_rows_with_the_environment_keys(run, engine, monkeypatch):
    define(engine)
    rl.configure_encryption(None)
    job = rl.enqueue(engine, JOB_TYPE, {"ssn": "078-05-1120"})
    use_keys(monkeypatch, k1=KEY)
    code, out, _ = run("encryption", "rotate", "--batch-size", "10", "--json")
    assert code == 0 and json.loads(out) == {"rewritten": 1}
    assert "078-05" not in scalar(engine, "SELECT payload::text FROM job_queue WHERE id = :id", id=job.id)
    code, out, _ = run("jobs", "show", str(job.id), "--json")
    assert code == 0 and json.loads(out)["job"]["payload"] == {"ssn": "078-05-1120"}


def test_jobs_show_names_the_key_it_lacks(run, engine, monkeypatch):
    define(engine)
    rl.configure_encryption(rl.Encryption(keys={"k1": KEY}, current="k1"))
    job = rl.enqueue(engine, JOB_TYPE, {"ssn": "078-05-1120"})
    use_keys(monkeypatch, k2=OTHER)
    code, out, _ = run("jobs", "show", str(job.id))
    assert code == 0
    assert "encryption key k1 missing" in out and "078-05" not in out


def test_bad_keys_in_the_environment_are_a_usage_error_with_the_code(run, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_ENCRYPTION_KEYS", "k1:" + base64.b64encode(b"short").decode())
    code, _, err = run("stats")
    assert code == 2 and "encryption.invalid_key" in err


def test_rotate_without_keys_is_refused_with_the_code(run, monkeypatch):
    monkeypatch.delenv("RUNLEDGER_ENCRYPTION_KEYS", raising=False)
    rl.configure_encryption(None)
    code, _, err = run("encryption", "rotate")
    assert code == 1 and "encryption.key_missing" in err


def test_the_dashboard_shows_a_payload_only_where_its_process_holds_the_key(engine):
    from werkzeug.test import Client

    from runledger_sync.web import allow_anyone, create_app

    define(engine)
    rl.configure_encryption(rl.Encryption(keys={"k1": KEY}, current="k1"))
    job = rl.enqueue(engine, JOB_TYPE, {"ssn": "078-05-1120"})
    client = Client(create_app(engine, authorize=allow_anyone))
    assert "078-05-1120" in client.get(f"/jobs/{job.id}?payload=1").get_data(as_text=True)
    rl.configure_encryption(rl.Encryption(keys={"k2": OTHER}, current="k2"))
    page = client.get(f"/jobs/{job.id}?payload=1").get_data(as_text=True)
    assert "encryption key k1 missing" in page and "078-05" not in page
