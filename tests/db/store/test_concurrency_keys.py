"""Concurrency keys (the spec's execution resources) on a real PostgreSQL: who holds a key's turn, and who is next.

A keyed job beyond its queue's ``key_limit`` waits PENDING with
``blocked_by_key``; the key trigger lets the next one go, in claim order, when
a live job of the key leaves (success, dead letter, cancel, delete). A retry or
a returned lease keeps the job live: no later job of its key overtakes it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

import runledger_sync as rl
from runledger_sync.core.types import JobFailure
from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema_queues import KEY_LOCK
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success, release_unstarted_job_claim
from runledger_sync.store.admin.actions import cancel_job, requeue_job
from runledger_sync.store.maintenance.reaper import reap_expired_leases
from runledger_sync.store.driver import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.queues import configure_queue
from tests.support import JOB_TYPE, define, expire_lease, identity, lock_waiters, rows, scalar, wait_until


@pytest.fixture(autouse=True)
def defined(engine) -> None:
    define(engine, max_attempts=5)


def claim(engine: Any, limit: int = 20, **kwargs: Any) -> list[Any]:
    return claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=limit, **kwargs)


def keyed(engine: Any, key: str, n: int = 0, **kwargs: Any) -> Any:
    return enqueue(engine, JOB_TYPE, {"n": n}, concurrency_key=key, **kwargs)


def held_back(engine: Any) -> set[Any]:
    return {row.id for row in rows(engine, "SELECT id FROM job_queue WHERE blocked_by_key AND status = 'PENDING'")}


def succeed(engine: Any, job: Any) -> Any:
    return complete_job_success(engine, **identity(job))


def ids(jobs: list[Any]) -> list[Any]:
    return [job.id for job in jobs]


def past(seconds: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)


# -- key_limit 1 ---------------------------------------------------------------------------


def test_the_second_job_of_a_key_waits_held_back_and_other_keys_and_plain_jobs_go(engine):
    first = keyed(engine, "customer:1", 1)
    second = keyed(engine, "customer:1", 2)
    third = keyed(engine, "customer:1", 3)
    other = keyed(engine, "customer:2", 4)
    plain = enqueue(engine, JOB_TYPE, {"n": 5})

    assert held_back(engine) == {second.id, third.id}
    assert (first.queue, first.concurrency_key) == ("default", "customer:1")
    assert sorted(ids(claim(engine)), key=str) == sorted([first.id, other.id, plain.id], key=str)
    assert claim(engine) == []
    # Held back is PENDING: nothing was spent on them.
    assert rows(engine, "SELECT status, attempt FROM job_queue WHERE blocked_by_key") == [("PENDING", 0), ("PENDING", 0)]


def release_by(engine: Any, how: str, head: Any) -> None:
    if how == "cancel_pending":  # the head was never claimed
        cancel_job(engine, head.id)
        return
    if how == "delete":
        with engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM job_queue WHERE id = %(id)s", {"id": head.id})
        return
    [leased] = claim(engine)
    assert leased.id == head.id
    if how == "success":
        succeed(engine, leased)
    elif how == "dead_letter":
        dead = complete_job_failure(engine, **identity(leased), failure=JobFailure.terminal("bad.input", "no"),
                                              retry_delay_ms=0)
        assert dead.status is JobStatus.DEAD_LETTERED
    elif how == "cancel_leased":
        cancel_job(engine, head.id)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["success", "dead_letter", "cancel_pending", "cancel_leased", "delete"])
def test_a_release_lets_the_next_job_of_the_key_go_in_claim_order(engine, how):
    head = keyed(engine, "k", 0, priority=100)
    low = keyed(engine, "k", 1, priority=1)
    late = keyed(engine, "k", 2, priority=5, run_at=past(10))
    early = keyed(engine, "k", 3, priority=5, run_at=past(20))  # enqueued later, due earlier
    high = keyed(engine, "k", 4, priority=9)
    assert held_back(engine) == {low.id, late.id, early.id, high.id}

    release_by(engine, how, head)

    # Priority first, then next_run_at, then created_at: one at a time, each after the last ends.
    order = []
    for _ in range(4):
        assert len(held_back(engine)) == 3 - len(order)
        [leased] = claim(engine)
        order.append(leased.id)
        assert claim(engine) == []
        succeed(engine, leased)
    assert order == [high.id, early.id, late.id, low.id]
    assert held_back(engine) == set()


def test_equal_jobs_of_a_key_go_in_enqueue_order(engine):
    jobs = [keyed(engine, "k", n) for n in range(6)]
    order = []
    while len(order) < len(jobs):
        [leased] = claim(engine)
        order.append(leased.id)
        succeed(engine, leased)
    assert order == ids(jobs)


def test_a_job_due_now_is_not_held_back_by_a_job_of_its_key_due_later(engine):
    later = keyed(engine, "k", 0, delay_seconds=3600)
    now = keyed(engine, "k", 1)

    assert held_back(engine) == {later.id}
    [leased] = claim(engine)
    assert leased.id == now.id
    succeed(engine, leased)
    assert held_back(engine) == set() and claim(engine) == []  # the later one has the turn, when it is due


def test_a_job_ahead_in_claim_order_takes_the_turn_of_one_not_yet_claimed(engine):
    low = keyed(engine, "k", 0, priority=1)
    high = keyed(engine, "k", 1, priority=9)
    same = keyed(engine, "k", 2, priority=9)  # equal: enqueue order, no swap

    assert held_back(engine) == {low.id, same.id}
    order = []
    for _ in range(3):
        [leased] = claim(engine)
        order.append(leased.id)
        succeed(engine, leased)
    assert order == [high.id, same.id, low.id]


def test_a_repeated_idempotent_enqueue_takes_no_turn(engine):
    first = keyed(engine, "k", 0, priority=9, idempotency_key="charge-1")
    succeed(engine, claim(engine)[0])
    waiting = keyed(engine, "k", 1, priority=1)

    again = keyed(engine, "k", 0, priority=9, idempotency_key="charge-1")  # the same request: no new job

    assert again.id == first.id
    assert held_back(engine) == set()
    assert ids(claim(engine)) == [waiting.id]


def test_a_job_being_claimed_keeps_its_turn_and_the_enqueue_does_not_wait_for_it(engine):
    head = keyed(engine, "k", 0, priority=1)
    with engine.connect() as claiming:
        # A claim holds the head's row until it commits.
        claiming.exec_driver_sql("SELECT 1 FROM job_queue WHERE id = %(id)s FOR UPDATE", {"id": head.id})
        high = keyed(engine, "k", 1, priority=9)
        claiming.rollback()

    assert held_back(engine) == {high.id}
    assert ids(claim(engine)) == [head.id]


def test_a_retry_keeps_the_keys_turn(engine):
    head = keyed(engine, "k", 0)
    [leased] = claim(engine)
    later = keyed(engine, "k", 1, priority=500)  # would go first, were the turn free

    retried = complete_job_failure(engine, **identity(leased), failure=JobFailure.retryable("busy", "m"),
                                             retry_delay_ms=300)

    assert retried.status is JobStatus.PENDING and held_back(engine) == {later.id}
    # Not due yet, and the later job may not take its place meanwhile.
    assert claim(engine) == []
    [again] = wait_until(lambda: claim(engine), what="the retry comes due")
    assert (again.id, again.attempt) == (head.id, 2)
    succeed(engine, again)
    assert ids(claim(engine)) == [later.id]


def test_a_reaped_lease_keeps_the_keys_turn(engine):
    head = keyed(engine, "k", 0)
    [leased] = claim(engine)
    later = keyed(engine, "k", 1, priority=500)
    expire_lease(engine, leased.id)

    reaped = reap_expired_leases(engine, limit=10, default_retry_delay_ms=1)

    assert reaped.retried == 1 and held_back(engine) == {later.id}
    [again] = wait_until(lambda: claim(engine), what="the reaped job comes due")
    assert (again.id, again.attempt) == (head.id, 2)


def test_an_unstarted_claim_handed_back_keeps_the_keys_turn(engine):
    head = keyed(engine, "k", 0)
    [leased] = claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=5, job_types=[JOB_TYPE])
    later = keyed(engine, "k", 1, priority=500)

    release_unstarted_job_claim(engine, **identity(leased), reason="shutdown", delay_ms=0)

    assert held_back(engine) == {later.id}
    assert ids(claim(engine)) == [head.id]


def test_a_requeued_keyed_job_waits_while_its_key_is_busy_and_goes_when_it_is_free(engine):
    first = keyed(engine, "k", 0)
    second = keyed(engine, "k", 1)
    succeed(engine, claim(engine)[0])
    [running] = claim(engine)
    assert running.id == second.id

    requeue_job(engine, first.id)

    assert held_back(engine) == {first.id}
    assert claim(engine) == []
    succeed(engine, running)
    [again] = claim(engine)
    assert (again.id, again.run_number) == (first.id, 2)
    succeed(engine, again)
    # With its key free, a requeued job is claimable at once.
    requeue_job(engine, second.id)
    assert held_back(engine) == set() and ids(claim(engine)) == [second.id]


def test_keys_are_per_queue(engine):
    configure_queue(engine, "other")
    here = keyed(engine, "k", 0)
    there = keyed(engine, "k", 1, queue="other")

    assert held_back(engine) == set()
    assert sorted(ids(claim(engine)), key=str) == sorted([here.id, there.id], key=str)


# -- other key limits ------------------------------------------------------------------------


def test_key_limit_two_lets_two_of_a_key_run_at_once(engine):
    configure_queue(engine, "pairs", key_limit=2)
    jobs = [keyed(engine, "k", n, queue="pairs") for n in range(5)]

    assert held_back(engine) == set(ids(jobs[2:]))
    first = claim(engine)
    assert ids(first) == ids(jobs[:2]) and claim(engine) == []
    succeed(engine, first[0])
    assert ids(claim(engine)) == [jobs[2].id]
    assert held_back(engine) == set(ids(jobs[3:]))


def test_key_limit_none_holds_nothing_back(engine):
    configure_queue(engine, "free", key_limit=None)
    jobs = [keyed(engine, "k", n, queue="free") for n in range(4)]

    assert held_back(engine) == set()
    assert ids(claim(engine)) == ids(jobs)


def test_raising_the_key_limit_lets_held_jobs_go_at_once_in_claim_order(engine):
    configure_queue(engine, "q")
    a = [keyed(engine, "a", n, queue="q") for n in range(5)]
    b = [keyed(engine, "b", n, queue="q") for n in range(2)]
    [leased_a, leased_b] = claim(engine)
    assert {leased_a.id, leased_b.id} == {a[0].id, b[0].id}

    configure_queue(engine, "q", key_limit=3)

    # Key a had one live job (leased): two more go; key b's one held job goes.
    assert held_back(engine) == {a[3].id, a[4].id}
    assert sorted(ids(claim(engine)), key=str) == sorted([a[1].id, a[2].id, b[1].id], key=str)

    configure_queue(engine, "q", key_limit=None)
    assert held_back(engine) == set()


def test_lowering_the_key_limit_stops_nothing_running_and_holds_back_what_has_not_started(engine):
    configure_queue(engine, "q", key_limit=3)
    jobs = [keyed(engine, "k", n, queue="q") for n in range(3)]
    running = claim(engine, limit=2)
    assert len(running) == 2

    configure_queue(engine, "q", key_limit=1)
    newcomer = keyed(engine, "k", 9, queue="q")

    # The key's next settling applies the new limit to what has not started yet.
    assert held_back(engine) == {jobs[2].id, newcomer.id}
    assert claim(engine) == []
    for job in running:
        succeed(engine, job)
    assert ids(claim(engine)) == [jobs[2].id]


def test_the_key_limit_holds_for_jobs_enqueued_together_in_claim_order(engine):
    specs = [rl.JobSpec(JOB_TYPE, {"n": n}, concurrency_key=f"k{n % 2}") for n in range(6)]
    specs.append(rl.JobSpec(JOB_TYPE, {"n": 6}, concurrency_key="k1", priority=500))
    jobs = rl.enqueue_many(engine, specs)

    # k0: the first of the batch; k1: the one ahead in claim order, though written last.
    assert held_back(engine) == set(ids(jobs[1:6]))
    assert sorted(ids(claim(engine)), key=str) == sorted([jobs[0].id, jobs[6].id], key=str)


# -- races -----------------------------------------------------------------------------------


def test_a_release_passes_over_a_next_job_being_canceled_and_waits_for_nothing(engine):
    head = keyed(engine, "k", 0)
    nxt = keyed(engine, "k", 1)
    after = keyed(engine, "k", 2)
    [leased] = claim(engine)
    assert leased.id == head.id

    with engine.connect() as canceling:
        # The next job is canceled in a transaction still open when the head ends:
        # the release does not wait for its row (it holds the key lock meanwhile),
        # it gives the turn to the one after it.
        cancel_job(canceling, nxt.id)
        succeed(engine, leased)
        canceling.commit()

    assert held_back(engine) == set()
    assert ids(claim(engine)) == [after.id]


@pytest.mark.parametrize("orders", [(["a", "c", "b"], ["b", "a", "c"])])
def test_two_batches_enqueueing_the_same_keys_in_other_orders_both_land_and_settle(engine, orders):
    # Both commits settle their keys under the one key lock, held here for a while:
    # each waits its turn, neither waits for the other in a circle.
    errors: list[BaseException] = []

    def batch(keys: list[str]) -> threading.Thread:
        thread = threading.Thread(target=lambda: _run(errors, rl.enqueue_many, engine, [
            rl.JobSpec(JOB_TYPE, {}, concurrency_key=key) for key in keys]))
        thread.start()
        return thread

    with engine.connect() as holder:
        holder.exec_driver_sql(KEY_LOCK)
        first = batch(orders[0])
        second = batch(orders[1])
        wait_until(lambda: lock_waiters(engine) == 2, what="both batches wait at their commits")
        holder.rollback()
    first.join(30)
    second.join(30)

    assert errors == []
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 6
    # One turn per key, whichever commit came first.
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE NOT blocked_by_key") == 3
    assert scalar(engine, "SELECT count(DISTINCT execution_resource_key) FROM job_queue WHERE NOT blocked_by_key") == 3


def test_an_open_transaction_that_enqueued_a_keyed_job_holds_no_lock_a_release_waits_for(engine):
    head = keyed(engine, "k", 0)
    [leased] = claim(engine)
    with engine.connect() as application:
        rl.enqueue(application, JOB_TYPE, {}, concurrency_key="k")  # open, not committed
        done = threading.Event()
        thread = threading.Thread(target=lambda: (complete_job_success(engine, **identity(leased)), done.set()))
        thread.start()
        assert done.wait(10), "the success write waited for the application's transaction"
        application.commit()
    thread.join(10)
    assert head.id == leased.id
    # The application's job, committed after the release, settles into the free turn.
    assert held_back(engine) == set()


def _run(errors: list[BaseException], function: Any, *args: Any) -> None:
    try:
        function(*args)
    except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
        errors.append(exc)


# -- cost ------------------------------------------------------------------------------------

HELD_BACK = 20_000


def write_keyed(engine: Any, keys: str, count: int, held_back: bool) -> None:
    """``count`` PENDING jobs of the keys ``keys`` names (``%(n)s``: a key each), as the key trigger leaves them.

    Written in one statement with triggers off, for speed: the state is given, not made.
    """
    with engine.begin() as connection:
        connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
        connection.exec_driver_sql(
            "INSERT INTO job_queue (id, job_type, max_attempts, queue, execution_resource_key, blocked_by_key) "
            "SELECT gen_random_uuid(), %(type)s, 5, 'default', replace(%(keys)s, '{n}', g::text), %(held)s "
            "FROM generate_series(1, %(count)s) g",
            {"type": JOB_TYPE, "keys": keys, "count": count, "held": held_back})


# job_queue's sequential scans, entries read from idx_job_queue_key_live and from all
# its indexes, so far. The counters are the backend's own, not yet reported, which
# may hold earlier transactions' too: only a difference taken inside one
# transaction is its own.
_READS = (
    "SELECT pg_stat_get_xact_numscans('job_queue'::regclass), "
    "pg_stat_get_xact_tuples_returned('idx_job_queue_key_live'::regclass), "
    "sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index WHERE indrelid = 'job_queue'::regclass"
)


def job_queue_reads(engine: Any, work: Callable[[Any], Any]) -> tuple[Any, tuple[int, ...]]:
    """What ``work(connection)`` returned, and its sequential scans of job_queue and index entries read (key index, all)."""
    with engine.connect() as connection:
        before = connection.exec_driver_sql(_READS).one()
        result = work(connection)
        after = connection.exec_driver_sql(_READS).one()
        connection.commit()
    return result, tuple(a - b for a, b in zip(after, before, strict=True))


def test_a_key_with_many_held_back_jobs_costs_an_enqueue_and_a_release_only_its_live_ones(engine):
    head = keyed(engine, "hot")
    write_keyed(engine, "hot", HELD_BACK, held_back=True)
    [leased] = claim(engine)
    assert leased.id == head.id
    write_keyed(engine, "customer:{n}", HELD_BACK, held_back=False)  # other keys' ready jobs in the same queue

    newcomer, enqueued = job_queue_reads(engine, lambda connection: keyed(connection, "hot", 1))
    _, released = job_queue_reads(engine, lambda connection: succeed(connection, leased))

    # A few entries of the key's index (its live job and the versions it left, the next
    # held-back one), not the key's 20,000 nor the queue's.
    for seq_scans, key_entries, entries in (enqueued, released):
        assert seq_scans == 0 and key_entries <= 10 and entries < 100, (enqueued, released)
    assert len(held_back(engine)) == HELD_BACK and newcomer.id in held_back(engine)
