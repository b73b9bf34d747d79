"""enqueue_many in chunks: any iterable, one statement per chunk, still all or nothing.

The chunk size is cut to 3 here so that a batch of 10 spans four statements;
bench/enqueue_memory.py measures the memory this bounds at full size.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import runledger_sync as rl
from runledger_sync.core.records import JobSpec
from runledger_sync.store.enqueue import enqueue
from tests.db.test_bad_input_api import table_digest
from tests.db.test_transactional_enqueue import caller, order_count, orders, psycopg2_connect  # noqa: F401 - fixtures
from tests.support import JOB_TYPE, define, scalar

BATCH = 10


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(enqueue, "ENQUEUE_CHUNK_SIZE", 3)


def specs(count: int = BATCH, bad_at: int | None = None, bad: Any = None) -> Iterator[JobSpec]:
    for n in range(count):
        yield bad if n == bad_at else JobSpec(JOB_TYPE, {"n": n})


BAD_SPECS = [
    (JobSpec(JOB_TYPE, {1: "int key"}), "job.invalid_payload"),
    (JobSpec(JOB_TYPE, {}, organization_id="\U0001f600" * 200), "job.invalid_argument"),
    (JobSpec("no.such.type", {}), "job.definition_not_found_or_disabled"),
    ("not a spec", "job.invalid_argument"),
]


def test_a_generator_longer_than_a_chunk_is_written_in_order(engine):
    define(engine)
    jobs = rl.enqueue_many(engine, specs(), event_log="full")

    assert [job.payload for job in jobs] == [{"n": n} for n in range(BATCH)]
    assert scalar(engine, "SELECT count(*) FROM job_queue") == BATCH
    assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'ENQUEUED'") == BATCH


def test_enqueue_many_ids_returns_the_stored_ids_in_order(engine):
    define(engine)
    ids = rl.enqueue_many_ids(engine, specs())

    assert [rl.get_job(engine, job_id).payload for job_id in ids] == [{"n": n} for n in range(BATCH)]


@pytest.mark.parametrize(("bad", "code"), BAD_SPECS, ids=["int-key", "org-bytes", "unknown-type", "not-a-spec"])
def test_a_bad_spec_in_a_later_chunk_leaves_nothing_written(engine, bad, code):
    define(engine)
    before = table_digest(engine)

    with pytest.raises(rl.RunledgerError) as caught:
        rl.enqueue_many(engine, specs(bad_at=8, bad=bad))

    assert caught.value.code == code
    assert table_digest(engine) == before


def test_keys_repeated_across_chunks_return_the_job_of_the_first(engine):
    define(engine)
    keyed = [JobSpec(JOB_TYPE, {"n": n % 4}, idempotency_key=f"k{n % 4}") for n in range(BATCH)]

    ids = rl.enqueue_many_ids(engine, keyed)

    assert ids[4:8] == ids[0:4] and ids[8:] == ids[0:2]
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 4


def test_in_the_caller_transaction_a_later_bad_chunk_takes_back_the_earlier_ones(caller, engine):  # noqa: F811
    caller.write_own_row("order-1")
    with pytest.raises(rl.InvalidPayload):
        rl.enqueue_many(caller.bind, specs(bad_at=8, bad=JobSpec(JOB_TYPE, {None: 1})))
    # The caller's own work survives the refused batch and commits.
    caller.commit()

    assert order_count(engine) == 1
    assert rl.count_jobs(engine) == 0


def test_in_the_caller_transaction_a_long_batch_commits_with_it(caller, engine):  # noqa: F811
    caller.write_own_row("order-1")
    jobs = rl.enqueue_many(caller.bind, specs())
    caller.commit()

    assert rl.count_jobs(engine) == BATCH == len(jobs)
    assert order_count(engine) == 1


def test_on_an_autocommit_connection_a_long_batch_is_still_all_or_nothing(orders, fresh_database):  # noqa: F811
    raw = psycopg2_connect(fresh_database)
    raw.autocommit = True
    try:
        with pytest.raises(rl.InvalidPayload):
            rl.enqueue_many(raw, specs(bad_at=8, bad=JobSpec(JOB_TYPE, {2: "x"})))
        assert rl.count_jobs(orders) == 0

        jobs = rl.enqueue_many(raw, specs())
        # Committed when the call returns, as a single statement would have been.
        assert rl.count_jobs(orders) == BATCH == len(jobs)
        assert raw.autocommit is True
    finally:
        raw.close()


def test_a_column_unset_in_every_row_of_a_chunk_stores_nulls_and_defaults_beside_per_row_values(engine):
    define(engine)
    # The chunk of 3 is [a, b, c]: organization_id and the idempotency key are unset in every
    # row of it (sent as one NULL); priority is set in one row only, so it still goes row by row.
    batch = [JobSpec(JOB_TYPE, {"n": 0}), JobSpec(JOB_TYPE, {"n": 1}, priority=7), JobSpec(JOB_TYPE, {"n": 2}),
             JobSpec(JOB_TYPE, {"n": 3}, organization_id="org-3", idempotency_key="k-3")]
    jobs = rl.enqueue_many(engine, batch)

    stored = [rl.get_job(engine, job.id) for job in jobs]
    assert [job.payload for job in stored] == [{"n": n} for n in range(4)]
    default_priority = stored[0].priority
    assert [job.priority for job in stored] == [default_priority, 7, default_priority, default_priority]
    assert [job.organization_id for job in stored] == [None, None, None, "org-3"]
    assert [job.idempotency_key for job in stored] == [None, None, None, "k-3"]
    assert [job.enqueue_request is None for job in stored] == [True, True, True, False]
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE organization_id IS NULL AND idempotency_key IS NULL"
                  " AND execution_resource_key IS NULL") == 3
