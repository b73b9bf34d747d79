"""The heartbeat timer thread a pool thread keeps from job to job."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from runledger_sync.runtime.attempt.watch import TimerThread


@pytest.fixture
def timer():
    made = TimerThread("test-timer")
    yield made
    made.close()


class Runs:
    """Records each run of a task: when, and on which thread."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.at: list[float] = []
        self.threads: list[str] = []
        self.started = threading.Event()
        self.returned = threading.Event()

    def __call__(self) -> None:
        self.at.append(time.monotonic())
        self.threads.append(threading.current_thread().name)
        self.started.set()
        time.sleep(self.seconds)
        self.returned.set()


def test_a_task_runs_on_the_timer_thread_once_it_is_due(timer):
    runs = Runs()
    scheduled = time.monotonic()
    timer.schedule(scheduled + 0.15, runs)
    assert runs.started.wait(5)
    assert 0.15 <= runs.at[0] - scheduled < 2.0
    assert runs.threads == ["test-timer"]


def test_a_task_withdrawn_before_it_is_due_never_runs(timer):
    runs = Runs()
    timer.schedule(time.monotonic() + 0.2, runs)
    timer.withdraw()
    time.sleep(0.5)
    assert runs.at == []


def test_withdraw_waits_until_a_started_task_returns(timer):
    runs = Runs(seconds=0.3)
    timer.schedule(time.monotonic(), runs)
    assert runs.started.wait(5)
    timer.withdraw()
    assert runs.returned.is_set()


def test_a_task_due_sooner_than_the_current_sleep_wakes_the_thread(timer):
    far = Runs()
    timer.schedule(time.monotonic() + 60, far)
    time.sleep(0.1)  # the thread now sleeps until the far task is due
    timer.withdraw()
    soon = Runs()
    scheduled = time.monotonic()
    timer.schedule(scheduled + 0.05, soon)
    assert soon.started.wait(5)
    assert soon.at[0] - scheduled < 2.0
    assert far.at == []


def test_one_thread_serves_job_after_job(timer):
    before = threading.active_count()
    ran = []
    for n in range(300):
        runs = Runs()
        # Every tenth "job" outlives its first renewal; the rest end before it.
        timer.schedule(time.monotonic() + (0.0 if n % 10 == 0 else 1.0), runs)
        if n % 10 == 0:
            assert runs.started.wait(5)
            ran.append(runs)
        timer.withdraw()
        assert threading.active_count() == before
    assert len(ran) == 30
    assert {name for runs in ran for name in runs.threads} == {"test-timer"}


def test_a_crashing_task_is_logged_and_the_next_task_still_runs(timer, caplog):
    crashed = threading.Event()

    def crash() -> None:
        crashed.set()
        raise RuntimeError("watch bug")

    caplog.set_level(logging.ERROR, logger="runledger_sync")
    timer.schedule(time.monotonic(), crash)
    assert crashed.wait(5)
    timer.withdraw()
    runs = Runs()
    timer.schedule(time.monotonic(), runs)
    assert runs.started.wait(5)
    [record] = [r for r in caplog.records if r.getMessage() == "heartbeat timer task crashed"]
    assert "watch bug" in str(record.exc_info[1])


def test_a_new_task_replaces_one_held_and_not_started(timer):
    held, replacement = Runs(), Runs()
    timer.schedule(time.monotonic() + 0.2, held)
    timer.schedule(time.monotonic() + 0.3, replacement)
    assert replacement.started.wait(5)
    time.sleep(0.2)
    assert held.at == [] and len(replacement.at) == 1


def test_a_new_task_waits_for_a_started_one_to_return(timer):
    running, following = Runs(seconds=0.3), Runs()
    timer.schedule(time.monotonic(), running)
    assert running.started.wait(5)
    timer.schedule(time.monotonic(), following)
    assert running.returned.is_set()
    assert following.started.wait(5)
    assert following.at[0] >= running.at[0] + 0.3


def test_close_drops_a_pending_task_and_ends_the_thread():
    timer = TimerThread("test-timer-closed")
    runs = Runs()
    timer.schedule(time.monotonic() + 0.2, runs)
    timer.close()
    assert not [t for t in threading.enumerate() if t.name == "test-timer-closed"]
    time.sleep(0.4)
    assert runs.at == []
    with pytest.raises(RuntimeError, match="closed"):
        timer.schedule(time.monotonic(), runs)


def test_renewals_share_one_thread_until_one_hangs_and_is_left_behind():
    timer = TimerThread("runledger-heartbeat-test")
    release = threading.Event()
    try:
        names = [timer.renewals().send(lambda: threading.current_thread().name).result(5) for _ in range(3)]
        idents = {timer.renewals().send(threading.get_ident).result(5) for _ in range(3)}
        assert names == ["runledger-renewal-test"] * 3 and len(idents) == 1
        hung = timer.renewals().send(release.wait)
        assert not hung.done()
        timer.leave_renewal_behind()
        # The next renewal does not wait behind the hung one.
        assert timer.renewals().send(threading.get_ident).result(5) not in idents
        release.set()
        assert hung.result(5) is True
    finally:
        release.set()
        timer.close()
