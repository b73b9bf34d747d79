"""The worker's outcome summary: one INFO line a minute and at stop, counts by outcome, none when idle."""

from __future__ import annotations

import logging

from runledger_sync.runtime.worker import tally as tally_module
from runledger_sync.runtime.worker.tally import OutcomeTally


def test_the_summary_counts_outcomes_since_the_last_one_and_stays_quiet_when_idle(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="runledger_sync")
    tally = OutcomeTally("w1")
    for outcome in ("succeeded", "succeeded", "dead_lettered"):
        tally.count(outcome)
    tally.report_if_due()  # not a minute yet
    assert caplog.records == []
    monkeypatch.setattr(tally_module, "SUMMARY_INTERVAL_SECONDS", 0.0)
    tally.report_if_due()
    [summary] = caplog.records
    assert (summary.getMessage(), summary.worker_id, summary.processed) == ("jobs processed", "w1", 3)
    assert summary.by_outcome == {"succeeded": 2, "dead_lettered": 1}
    tally.report()  # nothing ended since
    assert len(caplog.records) == 1
