"""The handlers' pace decides how much company the completer may expect within its linger."""

from __future__ import annotations

from runledger_sync.runtime.attempt.completer import FinishingSoon, HandlerPace

LINGER = 0.002


def test_before_any_handler_returned_every_running_job_may_come():
    assert HandlerPace().finishing_within(7, LINGER) == 7


def test_short_handlers_bring_every_running_job_within_the_linger():
    pace = HandlerPace()
    pace.record(0.0001)
    assert pace.finishing_within(7, LINGER) == 7


def test_long_handlers_bring_their_share_of_the_linger_and_no_more():
    pace = HandlerPace()
    pace.record(0.1)
    # Of 32 jobs of 100 ms, 0.64 finish within 2 ms: none worth waiting for.
    assert pace.finishing_within(32, LINGER) == 0
    assert pace.finishing_within(500, LINGER) == 10


def test_the_pace_follows_recent_handlers():
    pace = HandlerPace()
    pace.record(0.1)
    for _ in range(60):
        pace.record(0.0001)
    assert pace.finishing_within(32, LINGER) == 32


def test_finishing_soon_counts_queued_successes_and_the_handlers_due_back_meanwhile():
    finishing = FinishingSoon()
    finishing.running = 10
    assert finishing.within(LINGER) == 10  # no pace yet: every running job may come
    finishing.record(0.1)  # handlers take 100 ms: within the linger, almost none return
    finishing.queued = 3
    assert finishing.others_within(LINGER) == 0
    assert finishing.within(LINGER) == 3
    assert finishing.within(0.1) == 3 + 7
