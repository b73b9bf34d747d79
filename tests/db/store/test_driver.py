"""The typed driver: every runtime operation on one bind, its own transactions or the caller's.

The same claimed job's path (claim, running, outcome, read) runs through a driver
on an Engine, which commits each step, and on a caller's Connection, whose
rollback undoes every step. Signatures are compared with the store functions
they call, so the driver cannot drift from the store.
"""

from __future__ import annotations

import inspect
import select
import time
from typing import Any, Callable

import pytest
import sqlalchemy.exc

from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.outcomes import Retry, Succeed
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.core.types import JobCompletion, JobFailure
from runledger_sync.db.engine import create_engine
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.store import driver as driver_module
from runledger_sync.store.driver import Driver, StoreDriver, driver_for
from runledger_sync.store.admin.jobs import get_job
from runledger_sync.store.enqueue.enqueue import enqueue
from runledger_sync.store.transactions import HeldConnection
from runledger_sync.store.notify import new_probe_channel
from tests.support import JOB_TYPE, define, rows, scalar, wait_until

WORKER = "driver-worker"
#: Driver operations whose first argument is not the bind: they act on a listener's own connection.
ON_THE_LISTENER = {"listen", "read_notifications", "close_listener"}


def claim_run_and_succeed(driver: Driver) -> Any:
    """A claimed job's path one call at a time: claim, write running, write the outcome, read it back."""
    [claimed] = driver.claim_prestart_jobs_for_types(
        worker_id=WORKER, lease_ttl_seconds=30, limit=5, job_types=[JOB_TYPE])
    identity = LeaseIdentity.of(claimed)
    running = driver.mark_job_running(identity)
    assert (running.status, running.stage) == (JobStatus.LEASED, JobStage.RUNNING)
    assert driver.running_landed(identity) is True
    assert driver.apply_transitions([(identity, Succeed(JobCompletion(output={"sent": 1})))]) == [None]
    return driver.get_job(claimed.id)


def test_a_driver_on_an_engine_commits_each_step_of_a_job(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {"n": 1})
    driver = driver_for(engine)
    assert driver.owns_transactions is True

    done = claim_run_and_succeed(driver)

    assert (done.id, done.status, done.output) == (job.id, JobStatus.SUCCEEDED, {"sent": 1})
    # Committed: another connection sees it.
    assert scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "SUCCEEDED"


def test_a_driver_on_a_connection_joins_its_transaction_and_its_rollback_undoes_every_step(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {"n": 1})
    with engine.connect() as connection:
        driver = driver_for(connection)
        assert driver.owns_transactions is False

        done = claim_run_and_succeed(driver)

        assert done.status is JobStatus.SUCCEEDED
        # Nothing is committed while the caller's transaction is open.
        assert scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job.id) == "PENDING"
        connection.rollback()
    assert rows(engine, "SELECT status, attempt FROM job_queue WHERE id = :id", id=job.id) == [("PENDING", 0)]
    assert scalar(engine, "SELECT count(*) FROM job_attempts WHERE job_id = :id", id=job.id) == 0


def test_a_driver_on_a_held_connection_claims_and_starts_in_one_call_and_reads_a_failure_back(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {})
    held = HeldConnection(engine)
    try:
        driver = driver_for(held)
        started = driver.claim_and_start_jobs(worker_id=WORKER, lease_ttl_seconds=30, limit=5, job_types=[JOB_TYPE])
        [running] = started.running
        assert (running.id, running.stage) == (job.id, JobStage.RUNNING)
        identity = LeaseIdentity.of(running)
        retry = Retry(JobFailure.retryable("smtp.busy", "try later"), delay_ms=60_000)

        assert driver.apply_transitions([(identity, retry)]) == [None]

        assert driver.read_back_outcomes([(identity, retry)]) == [True]
        assert driver.get_job(job.id).last_error_code == "smtp.busy"
    finally:
        held.close()


def test_a_driver_on_a_held_connection_opens_a_listener_of_its_own_that_hears_a_probe(engine):
    held = HeldConnection(engine)
    driver = driver_for(held)
    channel = new_probe_channel()
    listener = driver.open_listener((channel,))
    try:
        driver.send_probe(channel, "are you there")
        heard: dict[str, set[str]] = {}
        # The notification arrives when the probe's transaction commits: wait on the socket, with a deadline.
        deadline = time.monotonic() + 10
        while channel not in heard and time.monotonic() < deadline:
            select.select([listener], [], [], 0.5)
            heard |= driver.read_notifications(listener)
        assert heard == {channel: {"are you there"}}
    finally:
        driver.close_listener(listener)
        held.close()
    assert listener.closed


def test_a_driver_in_a_callers_transaction_refuses_a_listener_which_needs_a_connection_of_its_own(engine):
    with engine.connect() as connection:
        joined = driver_for(connection)
        assert (joined.owns_transactions, joined.listens, joined.held()) == (False, False, joined)
        with pytest.raises(InvalidArgument) as refused:
            joined.open_listener()
    assert "a connection of its own" in refused.value.message


def test_a_claim_and_start_in_a_callers_transaction_only_claims_and_the_rollback_gives_the_job_back(engine):
    define(engine)
    job = enqueue(engine, JOB_TYPE, {})
    with engine.connect() as connection:
        started = driver_for(connection).claim_and_start_jobs(
            worker_id=WORKER, lease_ttl_seconds=30, limit=1, job_types=[JOB_TYPE])
        assert ([j.id for j in started.unstarted], started.running) == ([job.id], [])
        connection.rollback()
    assert get_job(engine, job.id).status.value == "PENDING"


def test_a_held_driver_keeps_one_connection_for_its_calls_until_closed(engine):
    held = driver_for(engine).held()
    try:
        assert held.owns_transactions and held.held() is held
        backends = {scalar_of(held) for _ in range(3)}
        assert len(backends) == 1
    finally:
        held.close()


def test_a_driver_apart_answers_while_the_binds_pool_is_taken_whole_and_its_close_disposes_of_it(fresh_database):
    full = create_engine(fresh_database, pool_size=1, max_overflow=0, pool_timeout=0.2)
    try:
        driver = driver_for(full)
        apart = driver.apart(timeout_seconds=2)
        with full.connect():  # the pool's one connection, taken
            with pytest.raises(sqlalchemy.exc.TimeoutError):
                driver.ping()
            apart.ping()
        backend = scalar_of(apart)
        apart.close()
        wait_until(lambda: scalar(full, "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid", pid=backend) == 0,
                   what="the driver apart's connection closes with it")
    finally:
        full.dispose()


def test_a_driver_in_a_callers_transaction_has_no_connection_to_set_apart(engine):
    with engine.connect() as connection:
        with pytest.raises(InvalidArgument) as refused:
            driver_for(connection).apart(timeout_seconds=1)
    assert "a connection of its own" in refused.value.message


def test_a_driver_stops_listening_once_its_engines_sessions_are_found_shared(engine):
    driver = driver_for(engine)
    assert (driver.listens, driver.pool_mode) == (True, "session")

    policy_of(engine).mark_sessions_shared()

    assert driver.listens is False and driver.held().listens is False


def test_a_driver_says_where_it_leads_without_the_password(engine):
    lazy = create_engine("postgresql://runner:s3cret@db.invalid:6432/jobs")  # never connected
    try:
        assert driver_for(lazy).location == "postgresql+psycopg2://runner:***@db.invalid:6432/jobs"
    finally:
        lazy.dispose()
    with engine.connect() as connection:
        joined = driver_for(connection)
        assert (joined.location, joined.pool_mode) == ("a caller's Connection", None)


def scalar_of(held):
    # The held connection's backend, read through the driver's own bind.
    with held.bind.connect() as connection:
        return connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()


def _store_function(name: str) -> Callable[..., Any]:
    function = getattr(driver_module, name)
    assert inspect.isfunction(function), name
    return function


def _operations() -> list[str]:
    return sorted(name for name, member in vars(Driver).items()
                  if inspect.isfunction(member) and not name.startswith("_"))


#: What the driver does with its connection, not an operation of the store.
CONNECTION_HANDLING = {"held", "apart", "close"}


@pytest.mark.parametrize("name", sorted(set(_operations()) - CONNECTION_HANDLING))
def test_each_operation_takes_what_its_store_function_takes_after_the_bind(name):
    store_parameters = list(inspect.signature(_store_function(name)).parameters.values())
    if name not in ON_THE_LISTENER:
        store_parameters = store_parameters[1:]
    for implementation in (Driver, StoreDriver):
        parameters = list(inspect.signature(getattr(implementation, name)).parameters.values())[1:]
        assert [(p.name, p.kind) for p in parameters] == [(p.name, p.kind) for p in store_parameters]
        if implementation is StoreDriver:
            assert [p.default for p in parameters] == [p.default for p in store_parameters]


def test_the_protocol_lists_every_operation_the_driver_module_names_but_those_for_tools():
    functions = {name for name in driver_module.__all__ if inspect.isfunction(getattr(driver_module, name))}
    # No database in these: the listener's probe channel and the parsing of an ENDED payload.
    pure = {"new_probe_channel", "ended_job_ids"}
    assert functions - pure - {"claim_jobs", "driver_for"} <= set(_operations())
    # Every operation is the store function of its name, which the driver module imports.
    assert all(inspect.isfunction(getattr(driver_module, name)) for name in set(_operations()) - CONNECTION_HANDLING)

