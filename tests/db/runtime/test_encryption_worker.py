"""A real worker meets sealed jobs: without the key it hands claims back unspent; rotation beside it loses nothing."""

from __future__ import annotations

import os
import threading
from typing import Iterator

import pytest

import runledger_sync as rl
from runledger_sync.core.encryption import active_encryption
from runledger_sync.core.records import JobSpec
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.queues import explain_wait
from runledger_sync.store.rotation import rotate_encryption, stale_counts
from tests import handlers as h
from tests.support import JOB_TYPE, rows, scalar, wait_until

KEY = {"2026-12": os.urandom(32)}
OTHER = {"2025-01": os.urandom(32)}


@pytest.fixture(autouse=True)
def restore_encryption() -> Iterator[None]:
    before = active_encryption()
    yield
    rl.configure_encryption(before)


def seen_payloads(probe: h.Probe) -> h.Handler:
    return h.scripted(probe, lambda ctx, payload, call: probe.note(payload))


def test_a_worker_without_the_key_hands_the_claim_back_unspent_and_says_which_key(engine, start_loop, probe, logs):
    registry = h.registry_with(JOB_TYPE, seen_payloads(probe))
    registry.sync_definitions(engine)
    rl.configure_encryption(rl.Encryption(keys=KEY, current="2026-12"))
    job = enqueue(engine, JOB_TYPE, {"n": 1})
    rl.configure_encryption(rl.Encryption(keys=OTHER, current="2025-01"))
    start_loop("worker", registry)

    wait_until(lambda: rows(engine, "SELECT 1 FROM job_events WHERE job_id = :id AND event_type = 'REQUEUED'",
                            id=job.id), what="the claim handed back")
    assert rows(engine, "SELECT status, attempt FROM job_queue WHERE id = :id", id=job.id) == [("PENDING", 0)]
    assert rows(engine, "SELECT count(*) FROM job_attempts WHERE job_id = :id", id=job.id) == [(0,)]
    wait = explain_wait(engine, job.id)
    assert wait.reason is rl.WaitReason.ENCRYPTION_KEY_MISSING
    assert wait.message.startswith("encryption key 2026-12 missing")
    assert probe.calls == []

    # Given the key, the worker runs it on its next turn, its attempts untouched.
    rl.configure_encryption(rl.Encryption(keys=KEY | OTHER, current="2025-01"))
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE job_queue SET next_run_at = now() WHERE id = %(id)s", {"id": job.id})
    wait_until(lambda: scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "SUCCEEDED")
    assert probe.notes == [{"n": 1}]
    assert scalar(engine, "SELECT attempt FROM job_queue WHERE id = :id", id=job.id) == 1


def test_rotation_beside_a_running_worker_loses_nothing(engine, start_loop, probe):
    registry = h.registry_with(JOB_TYPE, seen_payloads(probe))
    registry.sync_definitions(engine)
    total = 600
    # Clear rows from before encryption, then rows under an old key, then the current key.
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(0, 200)])
    rl.configure_encryption(rl.Encryption(keys=OTHER, current="2025-01"))
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(200, 400)])
    rl.configure_encryption(rl.Encryption(keys=KEY | OTHER, current="2026-12"))
    start_loop("worker", registry)
    rotated: list[int] = []
    rotation = threading.Thread(target=lambda: rotated.append(rotate_encryption(engine, batch_size=50)))
    rotation.start()
    enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": n}) for n in range(400, total)])
    rotation.join(60)
    wait_until(lambda: scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'SUCCEEDED'") == total,
               timeout=60)
    assert sorted(note["n"] for note in probe.notes) == list(range(total))
    assert rotated and rotated[0] > 0
    # Whatever the worker finished before the walk reached it, nothing is left under an old key or clear.
    rotate_encryption(engine)
    assert stale_counts(engine) == {"job_queue": 0, "job_dead_letters": 0, "workflow_steps": 0, "workflow_runs": 0,
                                    "job_batches": 0, "job_schedules": 0}
    assert rows(engine, "SELECT count(*) FROM job_attempts WHERE error_code IS NOT NULL") == [(0,)]
