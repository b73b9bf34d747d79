"""The scheduler loop beside the worker and reaper: each due instant becomes one job, however many processes tick."""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import runledger_sync as rl
from runledger_sync.core.encryption import active_encryption
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.runtime.worker.listener import JobListener
from runledger_sync.runtime.loops.scheduler import run_scheduler_loop, tick_once
from runledger_sync.store import notify
from runledger_sync.store.driver import driver_for
from tests import handlers as h
from tests.handlers import fast_config
from tests.support import JOB_TYPE, rows, scalar, wait_until

WINDOW_SECONDS = 10


def scheduled_for(engine) -> list[datetime]:
    return [datetime.fromisoformat(row[0].replace("Z", "+00:00")) for row in rows(
        engine, "SELECT payload -> '_schedule' ->> 'scheduled_for' FROM job_queue WHERE payload ? '_schedule'")]


def test_three_supervisors_enqueue_each_instant_of_a_per_second_schedule_once(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.schedule("every-second", cron="*/1 * * * * *", job_type=JOB_TYPE)
    registry.sync_definitions(engine)
    # A long poll: the loop must still fire on time by sleeping until the next due instant.
    config = fast_config(schedule_poll_interval_seconds=30)
    supervisors = [rl.Supervisor(engine, registry, config.with_overrides(worker_id=f"w{n}")) for n in range(3)]
    for supervisor in supervisors:
        supervisor.start()
    try:
        # A window of WINDOW_SECONDS instants: over as soon as that many were fired.
        wait_until(lambda: len(set(scheduled_for(engine))) >= WINDOW_SECONDS, timeout=3 * WINDOW_SECONDS,
                   interval=0.2, what=f"{WINDOW_SECONDS} instants fired")
    finally:
        for supervisor in supervisors:
            supervisor.stop(timeout=10)
    fires = Counter(scheduled_for(engine))
    assert [instant for instant, count in fires.items() if count > 1] == []
    instants = sorted(fires)
    span = int((instants[-1] - instants[0]).total_seconds()) + 1
    missing = [instants[0] + timedelta(seconds=n) for n in range(span) if instants[0] + timedelta(seconds=n) not in fires]
    assert span >= WINDOW_SECONDS - 2 and len(missing) <= 1, (span, missing)
    # The worker ran them as well: schedules feed the ordinary queue.
    assert rl.count_jobs(engine, status=rl.JobStatus.SUCCEEDED) >= len(instants) - 3


def test_the_loop_stops_at_once_on_an_invalid_config(engine, logs):
    registry = rl.JobRegistry()
    exit_reason = run_scheduler_loop(driver_for(engine), registry, fast_config(schedule_poll_interval_seconds=0), threading.Event())
    assert exit_reason is RuntimeLoopExit.INVALID_CONFIG
    assert [r.getMessage() for r in logs.records] == ["invalid jobs config; stopping scheduler loop"]


def test_a_supervisor_can_leave_the_scheduler_out(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.schedule("every-second", cron="*/1 * * * * *", job_type=JOB_TYPE)
    registry.sync_definitions(engine)
    supervisor = rl.Supervisor(engine, registry, fast_config(), run_scheduler=False).start()
    try:
        # An instant of the per-second schedule came due half a second ago and nobody fired it.
        wait_until(lambda: scalar(engine, "SELECT next_fire_at < now() - interval '0.5 seconds' FROM job_schedules"),
                   what="an instant of the schedule left unfired")
        assert "scheduler" not in supervisor.health(check_database=False).loops
    finally:
        supervisor.stop(timeout=10)
    assert set(supervisor.exits) == {"worker", "reaper"}
    assert scheduled_for(engine) == []


def test_a_schedule_that_fails_is_logged_with_its_name_and_code(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    rl.upsert_schedule(engine, "broken", cron_expr="*/1 * * * * *", job_type=JOB_TYPE)
    rl.set_job_definition_enabled(engine, JOB_TYPE, False)
    shutdown = threading.Event()
    loop = threading.Thread(target=run_scheduler_loop, args=(driver_for(engine), registry, fast_config(), shutdown))
    loop.start()
    try:
        wait_until(lambda: [r for r in logs.records if r.getMessage().startswith("schedule could not fire")])
    finally:
        shutdown.set()
        loop.join(10)
    record = next(r for r in logs.records if r.getMessage().startswith("schedule could not fire"))
    assert (record.schedule_name, record.error_code) == ("broken", "job.definition_not_found_or_disabled")


def test_a_scheduler_without_the_templates_key_warns_and_leaves_it_due_for_one_that_has_it(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    before = active_encryption()
    sealing, other = rl.Encryption(keys={"k1": os.urandom(32)}, current="k1"), rl.Encryption(
        keys={"k2": os.urandom(32)}, current="k2")
    try:
        rl.configure_encryption(sealing)
        rl.upsert_schedule(engine, "sealed", cron_expr="0 * * * * *", job_type=JOB_TYPE, payload_template={"a": 1})
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE job_schedules SET next_fire_at = now() - interval '1 second'")
        rl.configure_encryption(other)
        tick = tick_once(driver_for(engine), fast_config())
        assert (tick.fired, rl.count_jobs(engine)) == (0, 0)
        [record] = [r for r in logs.records if r.getMessage().startswith("schedule's payload template is sealed")]
        assert (record.levelno, record.schedule_name, record.error_code) == (
            logging.WARNING, "sealed", "encryption.key_missing")
        assert "encryption key k1 missing" in record.error
        assert not [r for r in logs.records if r.getMessage().startswith("schedule could not fire")]
        rl.configure_encryption(sealing)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE job_schedules SET next_fire_at = now() - interval '1 second'")
        assert tick_once(driver_for(engine), fast_config()).fired == 1
        assert rl.list_jobs(engine)[0].payload["a"] == 1
    finally:
        rl.configure_encryption(before)


def test_tick_once_fires_every_due_schedule_in_as_many_batches_as_it_takes(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    for n in range(7):
        rl.upsert_schedule(engine, f"s{n}", cron_expr="0 * * * * *", job_type=JOB_TYPE)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE job_schedules SET next_fire_at = now() - interval '1 second'")
    tick = tick_once(driver_for(engine), fast_config(claim_batch_size=3))
    assert tick.fired == 7 and rl.count_jobs(engine) == 7
    assert 0 < tick.next_due_in_seconds <= 60


def test_a_schedule_with_a_year_field_fires_its_last_instant_and_then_stops_quietly(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    last = (rows(engine, "SELECT now()")[0][0] + timedelta(seconds=2)).replace(microsecond=0).astimezone(timezone.utc)
    rl.upsert_schedule(engine, "once", job_type=JOB_TYPE,
                       cron_expr=f"{last.second} {last.minute} {last.hour} {last.day} {last.month} * {last.year}")
    supervisor = rl.Supervisor(engine, registry, fast_config(schedule_poll_interval_seconds=1)).start()
    try:
        wait_until(lambda: not rl.get_schedule(engine, "once").is_active, timeout=15)
        # Two more ticks at least (a second apart): a finished schedule is not tried again.
        finished_at = datetime.now(timezone.utc)
        wait_until(lambda: supervisor.health(check_database=False).loops["scheduler"].last_success_at
                   > finished_at + timedelta(seconds=1.5), timeout=10)
    finally:
        supervisor.stop(timeout=10)
    assert scheduled_for(engine) == [last]
    messages = [(r.levelname, r.getMessage()) for r in logs.records if getattr(r, "schedule_name", None) == "once"]
    assert messages == [("INFO", "schedule fired its last instant; now inactive")]
    assert rl.get_schedule(engine, "once").last_error_code is None


def scheduler_ticked_after(supervisor, moment: datetime):
    last = supervisor.health(check_database=False).loops["scheduler"].last_success_at
    return last is not None and last > moment


def seconds_until_a_fire(engine, fired_before: int, since: float) -> float:
    wait_until(lambda: len(scheduled_for(engine)) > fired_before, timeout=WAKE_BOUND_SECONDS + 5)
    return time.monotonic() - since


#: A poll interval far longer than any test waits: only a wake-up can make these fires prompt.
LONG_POLL_SECONDS = 30
#: Next instant at most 1 s away, plus a tick: well under the poll interval.
WAKE_BOUND_SECONDS = 3.0


def test_a_resumed_schedule_fires_at_its_next_instant_not_a_poll_interval_later(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.schedule("every-second", cron="*/1 * * * * *", job_type=JOB_TYPE)
    registry.sync_definitions(engine)
    supervisor = rl.Supervisor(engine, registry, fast_config(schedule_poll_interval_seconds=LONG_POLL_SECONDS))
    supervisor.start()
    try:
        wait_until(lambda: scheduled_for(engine), timeout=10)
        paused_at = datetime.now(timezone.utc)
        rl.pause_schedule(engine, "every-second")
        # A tick after the pause finds no active schedule and sleeps the whole poll interval.
        wait_until(lambda: scheduler_ticked_after(supervisor, paused_at), timeout=10)
        fired = len(scheduled_for(engine))
        resumed = time.monotonic()
        rl.resume_schedule(engine, "every-second")
        elapsed = seconds_until_a_fire(engine, fired, resumed)
    finally:
        supervisor.stop(timeout=10)
    assert elapsed < WAKE_BOUND_SECONDS, elapsed


def test_a_schedule_written_while_the_scheduler_sleeps_fires_at_its_next_instant(engine, probe, logs):
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    started_at = datetime.now(timezone.utc)
    supervisor = rl.Supervisor(engine, registry, fast_config(schedule_poll_interval_seconds=LONG_POLL_SECONDS))
    supervisor.start()
    try:
        wait_until(lambda: scheduler_ticked_after(supervisor, started_at), timeout=10)
        written = time.monotonic()
        rl.upsert_schedule(engine, "new", cron_expr="*/1 * * * * *", job_type=JOB_TYPE)
        elapsed = seconds_until_a_fire(engine, 0, written)
    finally:
        supervisor.stop(timeout=10)
    assert elapsed < WAKE_BOUND_SECONDS, elapsed
    assert len([r for r in logs.records if r.getMessage() == "schedule listener connected"]) == 1
    # Stopping closes the scheduler's LISTEN session with the worker's (its backend ends just after).
    wait_until(lambda: rows(engine, "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name "
                            "AND datname = current_database()", name=notify.LISTENER_APPLICATION_NAME)[0][0] == 0,
               timeout=5)


def test_a_triggered_schedule_runs_at_once_under_a_long_poll(engine, probe, logs):
    # trigger enqueues the job itself, and the enqueue notifies idle workers: no scheduler tick in between.
    registry = h.registry_with(JOB_TYPE, h.ok(probe))
    registry.sync_definitions(engine)
    rl.upsert_schedule(engine, "nightly", cron_expr="0 0 3 * * *", job_type=JOB_TYPE)
    config = fast_config(poll_interval_ms=LONG_POLL_SECONDS * 1000, schedule_poll_interval_seconds=LONG_POLL_SECONDS)
    supervisor = rl.Supervisor(engine, registry, config).start()
    try:
        wait_until(lambda: [r for r in logs.records if r.getMessage() == "listener connected"], timeout=10)
        triggered = time.monotonic()
        job = rl.trigger_schedule(engine, "nightly")
        wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED, timeout=10)
        elapsed = time.monotonic() - triggered
    finally:
        supervisor.stop(timeout=10)
    assert elapsed < 1.0, elapsed


def test_a_schedule_notification_read_by_a_probe_still_wakes_the_next_wait(engine, logs):
    listener = JobListener(driver_for(engine), None, worker_id="w", channel=notify.SCHEDULES_CHANNEL, name="schedule listener")
    try:
        assert listener.connect_if_due()
        with engine.begin() as conn:
            notify.notify_schedules_changed(conn)
        # Arrived on the socket, not read yet; the probe at the start of a pause reads it.
        readable, _, _ = select.select([listener._connection], [], [], 5)
        assert readable
        listener.probe()
        assert listener.wait(0) is True
        assert listener.wait(0) is False
    finally:
        listener.close()
