"""Batches under faults: 1,000 members across 2 worker processes, SIGKILLs and a PostgreSQL restart.

Every batch must finish once: its counts exact (each read back against its members'
rows), its callbacks enqueued exactly once each and run. Members are short effect
jobs; a killed worker's members come back through the reaper as retries (their
attempts stay within the effect type's budget), and a restart is ridden out by the
workers without a restart of their own.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import runledger_sync as rl
from tests.faults.fault_worker import EFFECT, NOOP
from tests.faults.harness import Db, WorkerFleet
from tests.faults.scenarios import BASE_SETTINGS, RestartableServer, prepare
from tests.support import wait_until

BATCHES = 4
MEMBERS = 250
TOTAL = BATCHES * MEMBERS


def leased_by(db: Db, worker_id: str) -> int:
    return db.scalar("SELECT count(*) FROM job_queue WHERE status = 'LEASED' AND worker_id = :w", w=worker_id)


def callbacks_of(db: Db, batch_id) -> list[tuple[str, str]]:
    return sorted((row.kind, row.status) for row in db.rows(
        "SELECT payload->>'kind' AS kind, status FROM job_queue WHERE job_type = :t AND payload->>'batch_id' = :b",
        t=NOOP, b=str(batch_id)))


@pytest.mark.timeout(180)
def test_batches_finish_once_with_exact_counts_across_sigkills_and_a_postgres_restart(tmp_path):
    server = RestartableServer(tmp_path, down_seconds=1.0)
    engine, db = prepare(server.url)
    rng = random.Random(7)  # noqa: S311 - reproducible durations, not secrets
    batch_ids = []
    for _ in range(BATCHES):
        batch = rl.open_batch(engine, on_success=(NOOP, {"kind": "success"}), on_complete=(NOOP, {"kind": "complete"}))
        rl.enqueue_many(engine, [rl.JobSpec(EFFECT, {"n": n, "ms": rng.randint(5, 40)}, batch=batch.id)
                                 for n in range(MEMBERS)])
        batch_ids.append(batch.id)
    # The last batch is closed only while its members run: the close races their ends.
    for batch_id in batch_ids[:-1]:
        rl.close_batch(engine, batch_id)
    settings = replace(BASE_SETTINGS, url=server.url, job_types=[EFFECT, NOOP])
    kills_that_hit = 0
    try:
        with WorkerFleet() as fleet:
            workers = [fleet.start(replace(settings, worker_id=f"batch{i}"), ready=False) for i in range(2)]
            for worker in workers:
                worker.wait_ready()

            def done(share: float) -> None:
                wait_until(lambda: db.count_status("SUCCEEDED", EFFECT) >= TOTAL * share, 60,
                           what=f"{share:.0%} of the members done")

            def kill_the_busiest() -> None:
                nonlocal kills_that_hit
                slot = max(range(len(workers)), key=lambda i: leased_by(db, workers[i].worker_id))
                kills_that_hit += leased_by(db, workers[slot].worker_id) > 0
                workers[slot].kill()
                workers[slot] = fleet.start(replace(settings, worker_id=f"batch{slot}"))

            done(0.2)
            kill_the_busiest()
            done(0.4)
            rl.close_batch(engine, batch_ids[-1])
            kill_the_busiest()
            done(0.6)
            engine.dispose()
            server.restart()
            engine = rl.create_engine(server.url)
            db = Db(engine)
            done(0.8)
            kill_the_busiest()
            wait_until(lambda: db.unfinished(EFFECT) == 0 and db.count_status("SUCCEEDED", NOOP) == 2 * BATCHES,
                       120, interval=0.2, what="every member and every callback done")
            assert all(worker.alive() for worker in workers)
        assert kills_that_hit >= 1
        assert db.count_status("SUCCEEDED", EFFECT) == TOTAL
        for batch_id in batch_ids:
            batch = rl.get_batch(engine, batch_id)
            members = dict(db.rows("SELECT status, count(*) FROM job_queue WHERE batch_id = :b GROUP BY status",
                                   b=batch_id))
            assert members == {"SUCCEEDED": MEMBERS}
            assert (batch.status, batch.total, batch.succeeded, batch.pending, batch.failed, batch.canceled) == (
                rl.BatchStatus.SUCCEEDED, MEMBERS, MEMBERS, 0, 0, 0), batch
            assert callbacks_of(db, batch_id) == [("complete", "SUCCEEDED"), ("success", "SUCCEEDED")]
        # Nothing else was enqueued: no callback twice, none for a batch that does not exist.
        assert db.scalar("SELECT count(*) FROM job_queue WHERE job_type = :t", t=NOOP) == 2 * BATCHES
        retried = db.scalar("SELECT count(*) FROM job_queue WHERE job_type = :t AND attempt > 1", t=EFFECT)
        print(f"batch faults: {BATCHES} batches of {MEMBERS}, kills that hit members {kills_that_hit}, "
              f"members retried {retried}, downtime {server.downtimes}")
    finally:
        engine.dispose()
        server.close()
