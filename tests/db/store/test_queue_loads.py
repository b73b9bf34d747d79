"""store.queues.queue_loads: each queue's counts, read through the partial indexes of the unfinished jobs.

It is read on every metrics scrape and every frame of ``top``: over a table of
finished jobs it must cost what the unfinished ones cost, not what the table does.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.store import queues
from tests.support import claim_one, define

FINISHED_ROWS = 200_000


def _scans(node: dict) -> list[dict]:
    found = [node] if "Scan" in node["Node Type"] else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


@pytest.mark.timeout(60)
def test_queue_loads_reads_indexes_not_the_finished_jobs(engine):
    rl.configure_queue(engine, "mail", global_limit=2)
    define(engine, "a", queue="mail")
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_queue (id, job_type, queue, status, stage, max_attempts, attempt, started_at, finished_at) "
            "SELECT gen_random_uuid(), 'a', 'mail', 'SUCCEEDED', 'completed', 3, 1, now(), now() "
            "FROM generate_series(1, :n)"), {"n": FINISHED_ROWS})
    for _ in range(4):
        rl.enqueue(engine, "a", {})
    rl.enqueue(engine, "a", {}, delay_seconds=600)
    claim_one(engine, job_type="a")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE job_queue"))
        compiled = queues._LOADS.compile(engine, compile_kwargs={"literal_binds": True})
        plan = conn.execute(text(f"EXPLAIN (FORMAT JSON) {compiled}")).scalar_one()
    scans = _scans(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])

    queue_scans = [scan for scan in scans if scan.get("Relation Name") == "job_queue"]
    assert queue_scans and all(scan["Node Type"] != "Seq Scan" for scan in queue_scans), scans
    assert all(scan["Plan Rows"] < FINISHED_ROWS // 100 for scan in queue_scans), scans
    mail = {load.queue.name: load for load in rl.queue_loads(engine)}["mail"]
    assert (mail.ready, mail.blocked_by_key, mail.scheduled, mail.leased) == (3, 0, 1, 1)
