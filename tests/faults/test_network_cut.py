"""Scenario 3: a worker's network is cut (through a TCP proxy) for longer than its lease while it runs a job."""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy

from tests.faults.harness import TcpProxy
from tests.faults.scenarios import BASE_SETTINGS, RECOVERY_SLACK_SECONDS, network_cut, recovery_bound


def test_proxy_cut_holds_a_query_back_until_it_heals(fresh_database):
    # The scenario below means something only if a cut really stalls a live connection.
    proxy = TcpProxy(fresh_database)
    engine = sqlalchemy.create_engine(proxy.url_for(fresh_database), poolclass=sqlalchemy.pool.NullPool)
    answers: list[int] = []
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            proxy.cut()
            query = threading.Thread(target=lambda: answers.append(conn.exec_driver_sql("SELECT 2").scalar()),
                                     daemon=True)
            query.start()
            query.join(1.0)
            assert query.is_alive() and answers == []
            proxy.heal()
            query.join(5.0)
            assert answers == [2]
    finally:
        proxy.close()
        engine.dispose()


@pytest.fixture(scope="module")
def cut(pg_server, template_database):
    """One run of the scenario, which both tests below read."""
    name = f"rl_fault_cut_{os.getpid()}"
    url = pg_server.create_database(name, template=template_database)
    try:
        yield network_cut(url)
    finally:
        pg_server.drop_database(name)


@pytest.mark.timeout(120)
def test_cut_off_worker_is_cancelled_its_job_recovered_and_its_late_completion_fenced(cut):
    result = cut.result
    print(result.summary())
    assert result.problems == []
    assert result.lost == 0
    assert result.duplicate_completions == 0
    assert result.duplicate_effects == 0
    # Recovered while the cut-off worker was still unreachable, within the lease bound.
    assert result.recovery_seconds <= recovery_bound(BASE_SETTINGS)
    assert cut.cancelled_after_cut is not None


def test_cut_off_worker_is_cancelled_when_its_lease_runs_out_not_when_the_network_returns(cut):
    # The last renewal before the cut was at most one heartbeat earlier, so the lease is
    # gone by TTL after the cut; the worker can know that from its own clock.
    bound = BASE_SETTINGS.lease_ttl_seconds + BASE_SETTINGS.heartbeat_interval_seconds + RECOVERY_SLACK_SECONDS
    assert cut.cancelled_during_cut
    assert cut.cancelled_after_cut <= bound
