"""A primary failover with synchronous replication loses nothing and spends no attempt on finished work.

A primary and a synchronous streaming standby on this machine, two worker
processes on a multi-host URL, 3,000 jobs; the primary is killed (``pg_ctl stop
-m immediate``) a third of the way through and the standby promoted. Every job
must have SUCCEEDED within 90 s of the promotion, none dead-lettered, every
enqueue acknowledged before the kill present after it, and only jobs in flight
at the kill run again. See :mod:`tests.faults.failover`.
"""

from __future__ import annotations

import configparser

import pytest

from tests.db.test_docs import marked
from tests.faults.failover import POLL_INTERVAL_MS, RECOVERY_BOUND_SECONDS, run_failover, text_report
from tests.faults.replication import ReplicatedPair, binaries, primary_settings

BINDIR, MISSING = binaries()
WORKERS = 2


@pytest.mark.timeout(240)
@pytest.mark.skipif(BINDIR is None, reason=f"no primary and standby can be built here: {MISSING}")
def test_a_synchronous_standby_promoted_mid_run_loses_nothing():
    assert BINDIR is not None
    with ReplicatedPair(BINDIR, synchronous=True) as pair:
        report = run_failover(pair, jobs=3000, workers=WORKERS)
    details = text_report(report)
    assert report.seconds_to_all_succeeded is not None, details
    assert report.seconds_to_all_succeeded <= RECOVERY_BOUND_SECONDS, details
    assert report.statuses == {"SUCCEEDED": 3000}, details
    assert report.dead_lettered == 0, details
    assert report.lost_enqueues == 0 and report.acknowledged_at_kill >= 1500, details
    assert report.lost_outcomes == 0, details
    # Only work in flight at the kill runs again, and at most what the workers held then.
    assert report.reruns_not_in_flight == 0, details
    assert report.reruns <= WORKERS * (4 + 8), details
    assert report.max_attempt <= 2, details
    # Each worker listened again, on the promoted server: a new job woke one at once, not at its next poll.
    assert all(connects >= 2 for connects in report.listener_connects), details
    assert report.pickup_after_seconds is not None and report.pickup_after_seconds < POLL_INTERVAL_MS / 1000 / 2, details


def test_the_deployment_guides_synchronous_settings_are_the_ones_this_test_runs():
    parser = configparser.RawConfigParser()
    parser.read_string(marked("failover-synchronous-settings", "ini"))
    documented = {f"{name} = {value}" for name, value in parser["postgresql.conf"].items()}
    assert documented == set(primary_settings(synchronous=True))
