"""An operator's cancel reaches a running handler at once: NOTIFY on commit, the worker's listener sets the flag.

The heartbeat is set far off (30 s) so only the notification can explain a
handler that sees its cancel within the bound. A cancel is not a lease loss:
the worker logs one INFO line with the operator's reason and no lease WARNING.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Optional

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.registry import JobRegistry
from runledger_sync.store import notify
from tests.handlers import MAX_BLOCK_SECONDS, fast_config
from tests.support import JOB_TYPE, attempts, event_types, wait_until

#: Far longer than the test: a heartbeat cannot be what told the handler.
LONG_HEARTBEAT_SECONDS = 30
SEEN_BOUND_SECONDS = 2.0
CANCELED_LINE = "job canceled by operator"


class CancelWatcher:
    """A handler that loops checking its cancel flag; records when it saw the cancel and the reason it was given."""

    def __init__(self) -> None:
        self.started: dict[str, threading.Event] = {}
        self.seen: dict[str, tuple[float, Optional[str]]] = {}
        self.ended = threading.Condition()

    def __call__(self, ctx: rl.JobContext, payload: dict) -> None:
        name = payload["name"]
        self.started.setdefault(name, threading.Event()).set()
        if not payload.get("loop", True):
            return
        deadline = time.monotonic() + MAX_BLOCK_SECONDS
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler's own work between two checks of the flag
        with self.ended:
            self.seen[name] = (time.perf_counter(), ctx.cancel_reason if ctx.cancelled else None)
            self.ended.notify_all()

    def wait_started(self, name: str) -> None:
        assert self.started.setdefault(name, threading.Event()).wait(10), f"job {name!r} did not start"

    def wait_seen(self, name: str, timeout: float = MAX_BLOCK_SECONDS + 5) -> tuple[float, Optional[str]]:
        with self.ended:
            assert self.ended.wait_for(lambda: name in self.seen, timeout), f"job {name!r} never returned"
            return self.seen[name]


def listening_worker(engine, start_loop, logs, watcher: CancelWatcher, **config):
    registry = JobRegistry()
    registry.job(JOB_TYPE, timeout_seconds=600)(watcher)
    registry.sync_definitions(engine)
    options = dict(heartbeat_interval_seconds=LONG_HEARTBEAT_SECONDS, lease_ttl_seconds=120) | config
    worker = start_loop("worker", registry, fast_config(**options))
    wait_until(lambda: [r for r in logs.records if r.getMessage() == "listener connected"], what="the LISTEN")
    return worker


def lease_warnings(logs) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.levelno >= logging.WARNING and "lease" in r.getMessage().lower()]


def canceled_lines(logs, job_id) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.getMessage() == CANCELED_LINE and getattr(r, "job_id", None) == str(job_id)]


def cancel_by_api(engine, run, job_id, reason):
    rl.cancel_job(engine, job_id, reason=reason)


def cancel_by_cli(engine, run, job_id, reason):
    code, _, err = run("jobs", "cancel", str(job_id), "--reason", reason)
    assert code == 0, err


@pytest.mark.parametrize("cancel", [cancel_by_api, cancel_by_cli])
@pytest.mark.parametrize("slots", [1, 4], ids=["busy-worker", "free-slots"])
def test_running_handler_sees_the_operators_cancel_and_reason_within_a_second(
        engine, start_loop, logs, run, cancel, slots):
    watcher = CancelWatcher()
    listening_worker(engine, start_loop, logs, watcher, max_global_concurrency=slots)
    job = rl.enqueue(engine, JOB_TYPE, {"name": "long"})
    watcher.wait_started("long")

    cancel(engine, run, job.id, "customer asked to stop")
    committed = time.perf_counter()

    seen_at, reason = watcher.wait_seen("long")
    assert reason == "customer asked to stop"
    assert seen_at - committed < SEEN_BOUND_SECONDS
    [line] = wait_until(lambda: canceled_lines(logs, job.id), what="the canceled line")
    assert (line.levelno, line.reason) == (logging.INFO, "customer asked to stop")
    # The slot comes back (one slot: the next job can only run once it has) and nothing was written after the cancel.
    rl.enqueue(engine, JOB_TYPE, {"name": "next", "loop": False})
    watcher.wait_started("next")
    after = rl.get_job(engine, job.id)
    assert (after.status, after.status_reason, after.output) == (rl.JobStatus.CANCELED, "customer asked to stop", None)
    assert event_types(engine, job.id)[-1] == "CANCELED"
    assert attempts(engine, job.id)[0].outcome is None
    assert lease_warnings(logs) == []


def test_a_notification_for_a_job_that_was_not_canceled_leaves_its_handler_running(engine, start_loop, logs):
    watcher = CancelWatcher()
    # Only a notification starts the marker job in time: it comes after ours, so ours was read first.
    listening_worker(engine, start_loop, logs, watcher, poll_interval_ms=60_000)
    job = rl.enqueue(engine, JOB_TYPE, {"name": "kept"})
    watcher.wait_started("kept")
    # Not from a cancel: the worker reads the row before it tells the handler anything.
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_notify(:channel, :id)"), {"channel": notify.CANCELED_CHANNEL, "id": str(job.id)})
    done = rl.enqueue(engine, JOB_TYPE, {"name": "marker", "loop": False})
    watcher.wait_started("marker")
    wait_until(lambda: rl.get_job(engine, done.id).status is rl.JobStatus.SUCCEEDED)
    assert "kept" not in watcher.seen
    assert rl.get_job(engine, job.id).status is rl.JobStatus.LEASED
    rl.cancel_job(engine, job.id, reason="now for real")
    assert watcher.wait_seen("kept")[1] == "now for real"


def test_cancel_notifies_the_running_job_id_on_commit_only(engine):
    registry = JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    job = rl.enqueue(engine, JOB_TYPE, {"name": "x"})
    listening = notify.open_listener(engine, (notify.CANCELED_CHANNEL,))
    try:
        with engine.connect() as conn:
            rl.cancel_job(conn, job.id, reason="rolled back")
            conn.rollback()
        select.select([listening], [], [], 0.3)
        assert notify.read_notifications(listening) == {}
        rl.cancel_job(engine, job.id, reason="kept")
        select.select([listening], [], [], 2.0)
        assert notify.read_notifications(listening) == {notify.CANCELED_CHANNEL: {str(job.id)}}
    finally:
        notify.close_listener(listening)
