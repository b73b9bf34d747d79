"""Unique jobs and debounce at enqueue: decided by the unique indexes in the enqueue's statement, on a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

import psycopg2
import pytest
from sqlalchemy import event, text

from runledger_sync.core.coordination import Debounce, Unique
from runledger_sync.core.coordination_errors import InvalidCoordination, InvalidDebounce, InvalidUnique
from runledger_sync.core.errors import (
    DefinitionNotFoundOrDisabled,
    EnqueueIdempotencyUnsupportedIsolation,
    IdempotencyConflict,
)
from runledger_sync.core.records import JobSpec, LeaseIdentity
from runledger_sync.core.states import JobStatus
from runledger_sync.core.types import JobFailure
from runledger_sync.db.engine import create_engine
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.definitions import set_job_definition_enabled
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many, enqueue_many_ids
from tests.support import (
    JOB_TYPE, claim_one, define, event_types, identity, lock_waiters, rows, scalar, wait_until, without_plan_settings,
    write_successes,
)


def count_jobs(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


def shift_clock(engine, job_id, **seconds_ago) -> None:
    """Move a job's timestamps into the past, as if it had been enqueued that long ago."""
    # Column names come from this module's calls, never from input.
    sets = ", ".join(f"{column} = {column} - make_interval(secs => :{column})" for column in seconds_ago)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE job_queue SET {sets} WHERE id = :id"), {"id": job_id, **seconds_ago})


# -- unique -----------------------------------------------------------------------


def test_a_unique_duplicate_returns_the_live_job_and_inserts_nothing(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"account": 7}, unique=Unique())
    again = enqueue(engine, JOB_TYPE, {"account": 7}, unique=Unique())

    assert first.disposition == "created"
    assert (again.id, again.disposition) == (first.id, "existing")
    assert count_jobs(engine) == 1
    assert first.unique_key is not None and first.unique_key.startswith("sha256:")
    assert list(first.unique_states) == ["PENDING", "LEASED"]


def test_without_a_key_the_payload_type_and_organization_make_the_key(engine):
    define(engine)
    define(engine, "test.other")
    a = enqueue(engine, JOB_TYPE, {"b": 1, "a": 2}, unique=Unique())
    same_in_other_order = enqueue(engine, JOB_TYPE, {"a": 2, "b": 1}, unique=Unique())
    other_payload = enqueue(engine, JOB_TYPE, {"a": 3}, unique=Unique())
    other_type = enqueue(engine, "test.other", {"b": 1, "a": 2}, unique=Unique())
    other_org = enqueue(engine, JOB_TYPE, {"b": 1, "a": 2}, organization_id="org-1", unique=Unique())
    same_org = enqueue(engine, JOB_TYPE, {"b": 1, "a": 2}, organization_id="org-1", unique=Unique())

    assert same_in_other_order.id == a.id
    assert len({a.id, other_payload.id, other_type.id, other_org.id}) == 4
    assert (same_org.id, same_org.disposition) == (other_org.id, "existing")
    assert count_jobs(engine) == 4


def test_a_key_replaces_the_payload_in_the_comparison(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"n": 1}, unique=Unique(key="account-7"))
    again = enqueue(engine, JOB_TYPE, {"n": 2}, unique=Unique(key="account-7"))

    assert again.id == first.id and again.payload == {"n": 1}
    assert first.unique_key == "account-7"


def test_a_plain_enqueue_is_never_blocked_by_a_unique_job(engine):
    define(engine)
    enqueue(engine, JOB_TYPE, {"n": 1}, unique=Unique())
    plain = enqueue(engine, JOB_TYPE, {"n": 1})
    assert plain.disposition == "created" and plain.unique_key is None
    assert count_jobs(engine) == 2


def test_a_finished_job_no_longer_blocks_with_the_default_states(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))
    leased = claim_one(engine)
    assert enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k")).id == first.id  # LEASED still blocks
    complete_job_success(engine, **identity(leased))

    second = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))

    assert second.id != first.id and second.disposition == "created"
    assert count_jobs(engine) == 2


def test_states_name_where_a_job_blocks(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", states=("PENDING", "LEASED", "SUCCEEDED")))
    complete_job_success(engine, **identity(claim_one(engine)))

    again = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", states=("PENDING", "LEASED", "SUCCEEDED")))

    assert (again.id, again.disposition) == (first.id, "existing")
    assert again.status is JobStatus.SUCCEEDED


def test_a_job_that_comes_back_into_its_states_comes_back_without_them(engine):
    # PENDING only: a running job no longer blocks, so a second one is enqueued;
    # the first one's retry must not collide with it in the index.
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", states=("PENDING",)))
    leased = claim_one(engine, prestart=False)
    second = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", states=("PENDING",)))
    assert second.id != first.id

    retried = complete_job_failure(engine, **identity(leased), failure=JobFailure.retryable("test.boom", "boom"), retry_delay_ms=0)

    assert retried.status is JobStatus.PENDING and retried.unique_states is None
    assert retried.unique_key == "k"  # still shown
    third = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", states=("PENDING",)))
    assert (third.id, third.disposition) == (second.id, "existing")


def test_period_buckets_the_key_on_the_database_clock(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", period=timedelta(hours=1)))
    again = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", period=3600))
    bucket = scalar(engine, "SELECT to_char(date_trunc('hour', now() AT TIME ZONE 'UTC'), "
                            "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
    assert again.id == first.id
    assert first.unique_key == f"k@{bucket}"
    # The live holder of another bucket does not block this one.
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_queue SET unique_key = 'k@1999-01-01T00:00:00Z' WHERE id = :id"), {"id": first.id})

    next_bucket = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k", period=timedelta(hours=1)))

    assert next_bucket.id != first.id and next_bucket.disposition == "created"


def test_unique_keeps_the_idempotency_check(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i", unique=Unique(key="u"))
    repeat = enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i", unique=Unique(key="u"))
    assert (repeat.id, repeat.disposition) == (first.id, "existing")
    complete_job_success(engine, **identity(claim_one(engine)))

    # The unique job finished, so only the idempotency key answers now, as it always did.
    assert enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i", unique=Unique(key="u")).id == first.id
    with pytest.raises(IdempotencyConflict):
        enqueue(engine, JOB_TYPE, {"n": 2}, idempotency_key="i", unique=Unique(key="u"))
    assert count_jobs(engine) == 1


def test_the_idempotency_key_answers_before_the_unique_key(engine):
    define(engine)
    keyed = enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i", unique=Unique(key="u"))
    complete_job_success(engine, **identity(claim_one(engine)))
    holder = enqueue(engine, JOB_TYPE, {"n": 9}, unique=Unique(key="u"))  # the key is free again: a new holder

    # Both keys are taken, each by another job: the request is the idempotent one's.
    assert enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i", unique=Unique(key="u")).id == keyed.id
    with pytest.raises(IdempotencyConflict):
        enqueue(engine, JOB_TYPE, {"n": 2}, idempotency_key="i", unique=Unique(key="u"))
    # A new idempotency key meets only the unique key's holder.
    assert enqueue(engine, JOB_TYPE, {"n": 3}, idempotency_key="j", unique=Unique(key="u")).id == holder.id
    assert count_jobs(engine) == 2


def test_an_idempotent_repeat_says_existing(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i")
    repeat = enqueue(engine, JOB_TYPE, {"n": 1}, idempotency_key="i")
    assert (first.disposition, repeat.disposition) == ("created", "existing")


def test_a_unique_enqueue_outside_read_committed_is_refused_and_a_debounce_is_not(engine):
    define(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(EnqueueIdempotencyUnsupportedIsolation):
            enqueue(conn, JOB_TYPE, {}, unique=Unique(key="k"))
        conn.rollback()
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        first = enqueue(conn, JOB_TYPE, {"v": 1}, debounce=Debounce("d", 30, 60))
        again = enqueue(conn, JOB_TYPE, {"v": 2}, debounce=Debounce("d", 30, 60))
        conn.commit()
    assert (again.id, again.disposition, again.payload) == (first.id, "replaced", {"v": 2})
    assert count_jobs(engine) == 1


# -- batches and transactions ------------------------------------------------------------


def test_enqueue_many_with_duplicates_in_the_batch_and_against_existing_rows(engine):
    define(engine)
    existing = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="old"))
    specs = [
        JobSpec(JOB_TYPE, {"n": 1}, unique=Unique(key="a")),
        JobSpec(JOB_TYPE, {"n": 2}, unique=Unique(key="a")),
        JobSpec(JOB_TYPE, {}, unique=Unique(key="old")),
        JobSpec(JOB_TYPE, {"n": 3}),
        JobSpec(JOB_TYPE, {"n": 4}, debounce=Debounce("d", 5, 60)),
        JobSpec(JOB_TYPE, {"n": 5}, debounce=Debounce("d", 5, 60)),
    ]

    jobs = enqueue_many(engine, specs)

    assert [job.disposition for job in jobs] == ["created", "existing", "existing", "created", "created", "replaced"]
    assert jobs[1].id == jobs[0].id and jobs[1].payload == {"n": 1}
    assert jobs[2].id == existing.id
    assert jobs[5].id == jobs[4].id and jobs[5].payload == {"n": 5} and jobs[5].debounce_count == 1
    assert count_jobs(engine) == 4
    assert enqueue_many_ids(engine, specs[:3]) == [jobs[0].id, jobs[0].id, existing.id]


def test_inside_a_callers_transaction_a_rollback_leaves_nothing(engine):
    define(engine)
    with engine.connect() as conn:
        with conn.begin() as tx:
            first = enqueue(conn, JOB_TYPE, {}, unique=Unique(key="k"))
            again = enqueue(conn, JOB_TYPE, {}, unique=Unique(key="k"))
            debounced = enqueue(conn, JOB_TYPE, {}, debounce=Debounce("d", 5, 60))
            assert again.id == first.id and debounced.disposition == "created"
            tx.rollback()
    assert count_jobs(engine) == 0
    # The key is free again.
    assert enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k")).disposition == "created"


def test_an_open_transaction_holding_a_key_makes_another_enqueue_wait_then_return_its_job(engine):
    define(engine)
    answers = []
    with engine.connect() as conn:
        with conn.begin():
            held = enqueue(conn, JOB_TYPE, {}, unique=Unique(key="k"))
            waiter = threading.Thread(target=lambda: answers.append(enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))))
            waiter.start()
            wait_until(lambda: lock_waiters(engine) >= 1, what="the second enqueue waiting on the key")
        waiter.join(10)
    assert [(job.id, job.disposition) for job in answers] == [(held.id, "existing")]


def test_eight_threads_enqueueing_the_same_unique_job_make_one_row(engine):
    define(engine)
    barrier = threading.Barrier(8)
    results, failures = [], []

    def enqueue_once() -> None:
        try:
            barrier.wait(10)
            results.append(enqueue(engine, JOB_TYPE, {"account": 7}, unique=Unique()))
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=enqueue_once) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert failures == []
    assert len({job.id for job in results}) == 1
    assert sorted(job.disposition for job in results) == ["created"] + ["existing"] * 7
    assert count_jobs(engine) == 1


ENQUEUE_IN_A_PROCESS = """
import sys
import runledger_sync as rl
engine = rl.create_engine(sys.argv[1])
ids = set()
for n in range(50):
    ids.add(rl.enqueue(engine, "test.job", {"n": n % 5}, unique=rl.Unique()).id)
    ids.add(rl.enqueue(engine, "test.job", {"d": 1}, debounce=rl.Debounce("d", 30, 60)).id)
print(len(ids))
"""


def test_two_processes_enqueueing_the_same_unique_and_debounced_jobs_make_one_row_each(engine, fresh_database):
    define(engine)
    processes = [subprocess.Popen([sys.executable, "-c", ENQUEUE_IN_A_PROCESS, fresh_database],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in processes]

    assert [process.returncode for process in processes] == [0, 0], outputs
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE unique_key LIKE 'sha256:%'") == 5
    debounced = rows(engine, "SELECT debounce_count FROM job_queue WHERE unique_key = 'd'")
    assert [row.debounce_count for row in debounced] == [99]


# -- debounce -----------------------------------------------------------------------


def test_debounce_replaces_a_waiting_jobs_payload_and_meta_and_moves_its_start(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"v": 1}, meta={"m": "1"}, debounce=Debounce("doc-7", timedelta(seconds=30),
                                                                                timedelta(minutes=10)))
    shift_clock(engine, first.id, next_run_at=20, created_at=20, debounce_until=20)

    second = enqueue(engine, JOB_TYPE, {"v": 2}, meta={"m": "2"}, debounce=Debounce("doc-7", 30, 600))

    assert (second.id, second.disposition, second.debounce_count) == (first.id, "replaced", 1)
    assert (second.payload, dict(second.meta)) == ({"v": 2}, {"m": "2"})
    start_in = scalar(engine, "SELECT extract(epoch FROM next_run_at - now()) FROM job_queue WHERE id = :id",
                      id=first.id)
    assert 29 <= float(start_in) <= 30.5
    assert count_jobs(engine) == 1


def test_debounce_never_moves_the_start_past_the_first_enqueue_plus_max_delay(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60))
    shift_clock(engine, first.id, created_at=50, debounce_until=50)

    second = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60))

    assert second.next_run_at == second.debounce_until
    left = scalar(engine, "SELECT extract(epoch FROM next_run_at - now()) FROM job_queue WHERE id = :id", id=first.id)
    assert 9 <= float(left) <= 10.5


def test_a_started_debounced_job_is_not_replaced_the_next_enqueue_makes_a_new_job(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {"v": 1}, debounce=Debounce("k", 0.001, 60))
    leased = claim_one(engine, prestart=False)
    assert leased.id == first.id

    second = enqueue(engine, JOB_TYPE, {"v": 2}, debounce=Debounce("k", 30, 60))

    assert second.id != first.id and second.disposition == "created" and second.debounce_count == 0
    assert rows(engine, "SELECT payload FROM job_queue WHERE id = :id", id=first.id)[0].payload == {"v": 1}
    # Its retry comes back as a plain job: it neither collides with the new one nor takes its debounces.
    retried = complete_job_failure(engine, **identity(leased), failure=JobFailure.retryable("test.boom", "boom"), retry_delay_ms=0)
    assert retried.status is JobStatus.PENDING and retried.unique_states is None
    assert enqueue(engine, JOB_TYPE, {"v": 3}, debounce=Debounce("k", 30, 60)).id == second.id


def test_a_claim_handed_back_unstarted_while_a_newer_debounce_waits_does_not_collide(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 0.001, 60))
    leased = claim_one(engine)
    second = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60))

    released = release_unstarted_job_claim(engine, **identity(leased), reason="shutdown", delay_ms=0)

    assert (released.id, released.status, released.unique_states) == (first.id, JobStatus.PENDING, None)
    assert enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60)).id == second.id


def test_a_replaced_job_writes_no_second_enqueued_event(engine):
    define(engine)
    first = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60), event_log="full")
    enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60), event_log="full")
    assert event_types(engine, first.id) == ["ENQUEUED"]


def test_debounce_keys_are_per_organization(engine):
    define(engine)
    a = enqueue(engine, JOB_TYPE, {}, organization_id="o1", debounce=Debounce("k", 30, 60))
    b = enqueue(engine, JOB_TYPE, {}, organization_id="o2", debounce=Debounce("k", 30, 60))
    c = enqueue(engine, JOB_TYPE, {}, debounce=Debounce("k", 30, 60))
    d = enqueue(engine, JOB_TYPE, {}, organization_id="o1", debounce=Debounce("k", 30, 60))
    assert len({a.id, b.id, c.id}) == 3 and (d.id, d.disposition) == (a.id, "replaced")


# -- a reply lost after the insert committed --------------------------------------------
#
# The store sends a one-statement enqueue again after a lost connection, with the ids
# drawn before its first try. The retry's insert meets the row the first try committed
# (in the unique index, or by its id once the job left its states) and inserts nothing;
# the call answers with that row as "created": the row holds the id drawn for this very
# call, so this call created it. "existing" would say another enqueue's job answered,
# and a caller counting what it added (a batch's members, a report) would count it wrong.


def lose_first_reply(engine, database_url, then=None):
    """Make the first enqueue statement's reply get lost after the statement committed; the pids it cut."""
    lost: list[int] = []

    def lose_the_reply(conn, cursor, statement, *rest):
        if without_plan_settings(statement).startswith("EXECUTE runledger_enqueue") and not lost:
            lost.append(conn.connection.dbapi_connection.get_backend_pid())
            with create_engine(database_url).connect() as killer:
                killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": lost[0]})
            if then is not None:
                then()
            raise psycopg2.OperationalError("server closed the connection unexpectedly")

    event.listen(engine, "after_cursor_execute", lose_the_reply)
    return lost


def test_a_unique_enqueue_whose_reply_is_lost_returns_the_job_it_created_written_once(fresh_database):
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0)
    try:
        define(engine)
        lost = lose_first_reply(engine, fresh_database)
        job = enqueue(engine, JOB_TYPE, {"once": True}, unique=Unique(key="k"), event_log="full")

        assert lost
        assert (job.disposition, job.unique_key, job.payload) == ("created", "k", {"once": True})
        assert rows(engine, "SELECT id FROM job_queue") == [(job.id,)]
        assert scalar(engine, "SELECT count(*) FROM job_events WHERE event_type = 'ENQUEUED'") == 1
    finally:
        engine.dispose()


def test_a_unique_batch_whose_reply_is_lost_tells_its_own_rows_from_a_live_duplicates(fresh_database):
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0)
    try:
        define(engine)
        held = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="held"))
        lost = lose_first_reply(engine, fresh_database)
        jobs = enqueue_many(engine, [JobSpec(JOB_TYPE, {}, unique=Unique(key="new")),
                                     JobSpec(JOB_TYPE, {}, unique=Unique(key="held"))])

        assert lost
        assert [job.disposition for job in jobs] == ["created", "existing"] and jobs[1].id == held.id
        assert sorted(rows(engine, "SELECT unique_key FROM job_queue")) == [("held",), ("new",)]
    finally:
        engine.dispose()


def test_a_unique_job_finished_before_the_retry_of_its_lost_enqueue_is_still_its_answer(fresh_database):
    # Its row no longer holds the key, so the retry's insert meets it by id only, and no
    # holder is left to read back: the store finds it by the id the call drew.
    engine = create_engine(fresh_database, pool_size=1, max_overflow=0)
    other = create_engine(fresh_database)
    try:
        define(engine)

        def run_it_to_the_end():
            write_successes(other, [(LeaseIdentity.of(claim_one(other)), None)])

        lost = lose_first_reply(engine, fresh_database, then=run_it_to_the_end)
        job = enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))

        assert lost
        assert job.disposition == "created"
        assert rows(engine, "SELECT id, status FROM job_queue") == [(job.id, "SUCCEEDED")]
    finally:
        other.dispose()
        engine.dispose()


# -- bad input -----------------------------------------------------------------------

# Options of the wrong kind, refused by code before their fields are read (once an AttributeError).
WRONG_KIND = [
    (dict(unique="yes"), InvalidUnique, "job.invalid_unique"),
    (dict(unique=True), InvalidUnique, "job.invalid_unique"),
    (dict(unique=0), InvalidUnique, "job.invalid_unique"),
    (dict(unique={"key": "k"}), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Debounce("k", 5, 60)), InvalidUnique, "job.invalid_unique"),
    (dict(debounce="yes"), InvalidDebounce, "job.invalid_debounce"),
    (dict(debounce=False), InvalidDebounce, "job.invalid_debounce"),
    (dict(debounce=Unique(key="k")), InvalidDebounce, "job.invalid_debounce"),
]

BAD = [
    (dict(unique=Unique(key="  ")), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(period=0)), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(period=timedelta(seconds=-5))), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(period=1.5)), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(states=("PENDING", "RUNNING"))), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(states=())), InvalidUnique, "job.invalid_unique"),
    (dict(unique=Unique(states="PENDING")), InvalidUnique, "job.invalid_unique"),
    (dict(debounce=Debounce("", 5, 60)), InvalidDebounce, "job.invalid_debounce"),
    (dict(debounce=Debounce("k", 0, 60)), InvalidDebounce, "job.invalid_debounce"),
    (dict(debounce=Debounce("k", timedelta(seconds=-1), 60)), InvalidDebounce, "job.invalid_debounce"),
    (dict(debounce=Debounce("k", 60, 30)), InvalidDebounce, "job.invalid_debounce"),
    *WRONG_KIND,
    (dict(unique=Unique(), debounce=Debounce("k", 5, 60)), InvalidCoordination, "job.invalid_coordination"),
    (dict(debounce=Debounce("k", 5, 60), delay_seconds=3), InvalidCoordination, "job.invalid_coordination"),
    (dict(debounce=Debounce("k", 5, 60), idempotency_key="i"), InvalidCoordination, "job.invalid_coordination"),
]


@pytest.mark.parametrize(("options", "error", "code"), BAD)
def test_bad_coordination_options_are_refused_with_a_code_and_write_nothing(engine, options, error, code):
    define(engine)
    with pytest.raises(error) as caught:
        enqueue(engine, JOB_TYPE, {}, **options)
    assert caught.value.code == code
    assert count_jobs(engine) == 0


@pytest.mark.parametrize(("options", "error", "code"), WRONG_KIND)
def test_a_bad_kind_of_option_in_a_batch_refuses_the_whole_batch(engine, options, error, code):
    define(engine)
    with pytest.raises(error) as caught:
        enqueue_many(engine, [JobSpec(JOB_TYPE, {"n": 1}), JobSpec(JOB_TYPE, {"n": 2}, **options)])
    assert caught.value.code == code and caught.value.argument in options
    assert count_jobs(engine) == 0


def test_unique_false_is_a_plain_enqueue_and_may_go_with_a_debounce(engine):
    define(engine)
    held = enqueue(engine, JOB_TYPE, {}, unique=Unique())
    plain = enqueue(engine, JOB_TYPE, {}, unique=False)
    debounced = [enqueue(engine, JOB_TYPE, {"v": v}, unique=False, debounce=Debounce("d", 5, 60)) for v in (1, 2)]

    assert [job.disposition for job in (held, plain, *debounced)] == ["created", "created", "created", "replaced"]
    assert plain.unique_key is None and debounced[0].unique_key == "d"
    assert count_jobs(engine) == 3


def test_a_disabled_type_is_refused_even_when_a_live_duplicate_holds_the_key(engine):
    define(engine)
    enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))
    set_job_definition_enabled(engine, JOB_TYPE, False)

    with pytest.raises(DefinitionNotFoundOrDisabled):
        enqueue(engine, JOB_TYPE, {}, unique=Unique(key="k"))
    with pytest.raises(DefinitionNotFoundOrDisabled):
        enqueue_many(engine, [JobSpec(JOB_TYPE, {}, unique=Unique(key="k")), JobSpec(JOB_TYPE, {})])
    assert count_jobs(engine) == 1
