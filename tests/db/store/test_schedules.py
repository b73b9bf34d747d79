"""Cron schedules in the store (spec section 8): writes, reads, and the tick, on a real PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

import runledger_sync as rl
from runledger_sync.core import errors
from runledger_sync.core.cron import jitter_seconds, parse_cron
from runledger_sync.core.store_errors import DefinitionNotFound
from runledger_sync.store.definitions import set_job_definition_enabled
from runledger_sync.store.maintenance.schedule_tick import fire_due_schedules
from tests.support import JOB_TYPE, define, rows, scalar, wait_until

EVERY_MINUTE = "0 * * * * *"
OTHER_TYPE = "test.other"


@pytest.fixture
def defined(engine):
    define(engine)
    define(engine, OTHER_TYPE)
    return engine


def db_now(engine) -> datetime:
    return scalar(engine, "SELECT now()")


def make_due(engine, name: str, seconds_ago: float = 1.0) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE job_schedules SET next_fire_at = now() - make_interval(secs => %(s)s) WHERE name = %(n)s",
            {"s": seconds_ago, "n": name})


def job_count(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


# -- writes ---------------------------------------------------------------------------


def test_upsert_writes_a_schedule_due_at_its_first_instant_after_now(defined):
    before = db_now(defined)
    schedule = rl.upsert_schedule(defined, "hourly", cron_expr="@hourly", job_type=JOB_TYPE,
                                  payload_template={"kind": "roll-up"}, organization_id="org-1")
    expected = parse_cron("@hourly").next_fire(before)
    assert schedule.next_fire_at in (expected, expected + timedelta(hours=1))
    assert (schedule.is_active, schedule.source, schedule.timezone, schedule.last_fired_at) == (True, "api", "UTC", None)
    assert rl.get_schedule(defined, "hourly") == schedule


def test_writing_the_same_schedule_again_keeps_its_next_fire_and_a_new_timing_moves_it(defined):
    first = rl.upsert_schedule(defined, "s", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    make_due(defined, "s", 30)
    due = rl.get_schedule(defined, "s").next_fire_at
    again = rl.upsert_schedule(defined, "s", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE, payload_template={"v": 2})
    assert (again.id, again.next_fire_at, again.payload_template) == (first.id, due, {"v": 2})
    moved = rl.upsert_schedule(defined, "s", cron_expr="0 0 * * * *", job_type=JOB_TYPE)
    assert moved.next_fire_at > db_now(defined)


@pytest.mark.parametrize(("arguments", "code"), [
    ({"cron_expr": "0 61 * * * *"}, "schedule.invalid_cron"),
    ({"cron_expr": "@fortnightly"}, "schedule.invalid_cron"),
    ({"timezone": "Mars/Olympus"}, "schedule.invalid_timezone"),
    ({"timezone": "localtime"}, "schedule.invalid_timezone"),
    ({"cron_expr": "0 0 0 1 1 * 2020"}, "schedule.invalid_cron"),
    ({"cron_expr": "0 R * * * *"}, "schedule.invalid_cron"),
    ({"job_type": "no.such.type"}, "job.definition_not_found"),
    ({"max_jitter_seconds": -1}, "job.invalid_argument"),
    ({"payload_template": {"x": {1, 2}}}, "job.invalid_payload"),
])
def test_a_bad_schedule_is_refused_with_its_code_and_nothing_is_written(defined, arguments, code):
    values = {"cron_expr": EVERY_MINUTE, "job_type": JOB_TYPE} | arguments
    with pytest.raises(errors.RunledgerError) as caught:
        rl.upsert_schedule(defined, "bad", **values)
    assert caught.value.code == code
    assert scalar(defined, "SELECT count(*) FROM job_schedules") == 0


def test_an_unknown_job_type_is_refused_naming_the_schedule_and_the_type(defined):
    with pytest.raises(DefinitionNotFound) as caught:
        rl.upsert_schedule(defined, "nightly", cron_expr=EVERY_MINUTE, job_type="no.such.type")
    assert caught.value.code == "job.definition_not_found"
    assert "schedule 'nightly' names job type 'no.such.type', which has no definition" in caught.value.message
    assert "foreign key" not in caught.value.message
    assert scalar(defined, "SELECT count(*) FROM job_schedules") == 0


def test_sync_refuses_a_declared_schedule_of_a_type_with_no_definition_and_writes_no_schedule(defined):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.schedule("fine", cron=EVERY_MINUTE, job_type=JOB_TYPE)
    registry.schedule("orphan", cron=EVERY_MINUTE, job_type="not.registered")
    with pytest.raises(DefinitionNotFound) as caught:
        registry.sync_definitions(defined)
    assert "schedule 'orphan' names job type 'not.registered'" in caught.value.message
    assert caught.value.details == {"schedule_name": "orphan", "job_type": "not.registered"}
    assert scalar(defined, "SELECT count(*) FROM job_schedules") == 0


def test_unknown_names_are_refused_as_not_found(defined):
    for action in (rl.pause_schedule, rl.resume_schedule, rl.delete_schedule, rl.trigger_schedule):
        with pytest.raises(errors.ScheduleNotFound) as caught:
            action(defined, "nope")
        assert caught.value.code == "schedule.not_found"
    assert rl.get_schedule(defined, "nope") is None


def test_list_and_delete(defined):
    rl.upsert_schedule(defined, "b", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    rl.upsert_schedule(defined, "a", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE, is_active=False)
    assert [s.name for s in rl.list_schedules(defined)] == ["a", "b"]
    assert [s.name for s in rl.list_schedules(defined, active=True)] == ["b"]
    assert rl.delete_schedule(defined, "a").name == "a"
    assert [s.name for s in rl.list_schedules(defined)] == ["b"]


# -- the tick --------------------------------------------------------------------------


def test_a_due_schedule_enqueues_its_template_marked_with_the_fire_and_moves_on(defined):
    schedule = rl.upsert_schedule(defined, "report", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE,
                                  payload_template={"kind": "daily"}, organization_id="org-1")
    make_due(defined, "report")
    due_at = rl.get_schedule(defined, "report").next_fire_at
    tick = fire_due_schedules(defined, limit=16)
    assert (tick.fired, tick.failed, tick.full) == (1, (), False)
    [job] = rl.list_jobs(defined)
    assert job.payload == {"kind": "daily", "_schedule": {
        "schedule_id": str(schedule.id), "schedule_name": "report",
        "scheduled_for": due_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
    assert (job.stage, job.status, job.organization_id) == (rl.JobStage.SCHEDULED, rl.JobStatus.PENDING, "org-1")
    after = rl.get_schedule(defined, "report")
    assert after.last_fired_at is not None and after.next_fire_at > db_now(defined)
    assert 0 < tick.next_due_in_seconds <= 60


def test_the_tick_enqueues_at_the_event_log_level_it_is_given(defined):
    for name in ("quiet", "logged"):
        rl.upsert_schedule(defined, name, cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
        make_due(defined, name)
        level = {"event_log": "full"} if name == "logged" else {}
        assert fire_due_schedules(defined, limit=16, **level).fired == 1

    logged = rows(defined, "SELECT j.payload->'_schedule'->>'schedule_name' AS name, e.stage FROM job_events e "
                           "JOIN job_queue j ON j.id = e.job_id WHERE e.event_type = 'ENQUEUED'")
    assert [(row.name, row.stage) for row in logged] == [("logged", "scheduled")]
    assert job_count(defined) == 2


def test_the_tick_refuses_an_unknown_event_log_level_before_any_write(defined):
    rl.upsert_schedule(defined, "s", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    make_due(defined, "s")

    with pytest.raises(errors.InvalidArgument) as refused:
        fire_due_schedules(defined, limit=16, event_log="verbose")

    assert refused.value.code == "job.invalid_argument"
    assert (job_count(defined), rl.get_schedule(defined, "s").last_fired_at) == (0, None)


def test_a_template_that_is_not_an_object_is_wrapped(defined):
    rl.upsert_schedule(defined, "list", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE, payload_template=[1, 2])
    make_due(defined, "list")
    fire_due_schedules(defined, limit=16)
    [job] = rl.list_jobs(defined)
    assert job.payload["payload"] == [1, 2] and job.payload["_schedule"]["schedule_name"] == "list"


def test_five_minutes_of_downtime_fire_a_per_minute_schedule_once(defined):
    rl.upsert_schedule(defined, "minutely", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    make_due(defined, "minutely", 5 * 60)
    assert fire_due_schedules(defined, limit=16).fired == 1
    assert fire_due_schedules(defined, limit=16).fired == 0
    assert job_count(defined) == 1
    assert rl.get_schedule(defined, "minutely").next_fire_at - db_now(defined) <= timedelta(seconds=60)


def test_a_schedule_that_cannot_fire_never_blocks_the_others(defined):
    for name in ("fine", "disabled-type", "edited-cron", "edited-zone"):
        job_type = OTHER_TYPE if name == "disabled-type" else JOB_TYPE
        rl.upsert_schedule(defined, name, cron_expr=EVERY_MINUTE, job_type=job_type)
        make_due(defined, name)
    set_job_definition_enabled(defined, OTHER_TYPE, False)
    with defined.begin() as conn:
        conn.exec_driver_sql("UPDATE job_schedules SET cron_expr = 'every blue moon' WHERE name = 'edited-cron'")
        conn.exec_driver_sql("UPDATE job_schedules SET timezone = 'Mars/Olympus' WHERE name = 'edited-zone'")
    tick = fire_due_schedules(defined, limit=16)
    assert tick.fired == 1
    assert sorted((f.name, f.code) for f in tick.failed) == [
        ("disabled-type", "job.definition_not_found_or_disabled"),
        ("edited-cron", "schedule.invalid_cron"),
        ("edited-zone", "schedule.invalid_timezone"),
    ]
    assert [job.payload["_schedule"]["schedule_name"] for job in rl.list_jobs(defined)] == ["fine"]
    failed = {r.name: r for r in rows(defined, "SELECT name, last_error_code, next_fire_at - now() AS wait, "
                                               "last_error_at FROM job_schedules WHERE name <> 'fine'")}
    for name, row in failed.items():
        assert row.last_error_code is not None and row.last_error_at is not None, name
        assert timedelta(seconds=29) < row.wait <= timedelta(seconds=30), name
    # Once the type is enabled again, its next try fires it and clears the error.
    set_job_definition_enabled(defined, OTHER_TYPE, True)
    make_due(defined, "disabled-type")
    assert fire_due_schedules(defined, limit=16).fired == 1
    assert rl.get_schedule(defined, "disabled-type").last_error_code is None


def one_instant_cron(instant: datetime) -> str:
    """A seconds-first cron with a year field that names ``instant`` (UTC) and nothing else."""
    at = instant.astimezone(timezone.utc)
    return f"{at.second} {at.minute} {at.hour} {at.day} {at.month} * {at.year}"


def test_a_schedule_fires_its_last_instant_then_is_made_inactive_without_an_error(defined):
    last = (db_now(defined) + timedelta(seconds=2)).replace(microsecond=0)
    schedule = rl.upsert_schedule(defined, "once", cron_expr=one_instant_cron(last), job_type=JOB_TYPE)
    assert schedule.next_fire_at == last
    tick = wait_until(lambda: (t := fire_due_schedules(defined, limit=16)).fired and t, timeout=10)
    assert (tick.fired, tick.failed, tick.finished) == (1, (), ("once",))
    [job] = rl.list_jobs(defined)
    assert job.payload["_schedule"]["scheduled_for"] == last.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    after = rl.get_schedule(defined, "once")
    assert (after.is_active, after.next_fire_at, after.last_error_code) == (False, last, None)
    assert after.last_fired_at is not None
    again = fire_due_schedules(defined, limit=16)
    assert (again.fired, again.failed, again.next_due_in_seconds) == (0, (), None)
    # It cannot be resumed: nothing is left to fire. Its row stays as it was.
    with pytest.raises(errors.InvalidCron) as caught:
        rl.resume_schedule(defined, "once")
    assert caught.value.message.startswith("schedule 'once': cron expression")
    assert caught.value.message.endswith("so it would never fire")
    assert rl.get_schedule(defined, "once") == after


def test_a_full_batch_says_so_and_the_rest_fire_in_the_next(defined):
    for n in range(5):
        rl.upsert_schedule(defined, f"s{n}", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
        make_due(defined, f"s{n}")
    first = fire_due_schedules(defined, limit=3)
    second = fire_due_schedules(defined, limit=3)
    assert (first.fired, first.full, second.fired, second.full) == (3, True, 2, False)
    assert job_count(defined) == 5


def test_pausing_stops_fires_at_once_and_resuming_skips_the_missed_instants(defined):
    rl.upsert_schedule(defined, "p", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    make_due(defined, "p", 600)
    assert rl.pause_schedule(defined, "p").is_active is False
    assert fire_due_schedules(defined, limit=16).fired == 0
    resumed = rl.resume_schedule(defined, "p")
    assert resumed.is_active and resumed.next_fire_at > db_now(defined)
    assert fire_due_schedules(defined, limit=16).fired == 0
    assert job_count(defined) == 0


def test_a_declared_schedule_keeps_an_operators_pause(defined):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.schedule("nightly", cron="0 0 3 * * *", job_type=JOB_TYPE, payload={"n": 1})
    registry.sync_definitions(defined)
    assert rl.get_schedule(defined, "nightly").source == "code"
    rl.pause_schedule(defined, "nightly")
    registry.sync_definitions(defined)
    assert rl.get_schedule(defined, "nightly").is_active is False


def test_deleting_a_declared_schedule_is_refused_and_pausing_it_lasts(defined):
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    registry.schedule("nightly", cron="0 0 3 * * *", job_type=JOB_TYPE)
    registry.sync_definitions(defined)
    with pytest.raises(errors.ScheduleDeclaredInCode) as caught:
        rl.delete_schedule(defined, "nightly")
    assert caught.value.code == "schedule.declared_in_code"
    assert "schedule 'nightly' is declared in code" in caught.value.message and "Pause it instead" in caught.value.message
    assert rl.get_schedule(defined, "nightly").is_active is True
    # What the message offers: a pause, which the next sync keeps.
    rl.pause_schedule(defined, "nightly")
    registry.sync_definitions(defined)
    assert rl.get_schedule(defined, "nightly").is_active is False
    # Once the code no longer declares it, force deletes it and a sync of that code leaves it deleted.
    without = rl.JobRegistry()
    without.job(JOB_TYPE)(lambda ctx, payload: None)
    assert rl.delete_schedule(defined, "nightly", force=True).name == "nightly"
    without.sync_definitions(defined)
    assert rl.get_schedule(defined, "nightly") is None


def test_a_schedule_dropped_from_code_is_reported_and_paused_only_when_asked(defined, caplog):
    old = rl.JobRegistry()
    old.job(JOB_TYPE)(lambda ctx, payload: None)
    old.schedule("gone", cron=EVERY_MINUTE, job_type=JOB_TYPE)
    old.sync_definitions(defined)
    rl.upsert_schedule(defined, "made-by-api", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE)
    new = rl.JobRegistry()
    new.job(JOB_TYPE)(lambda ctx, payload: None)
    new.sync_definitions(defined)
    [warning] = [r for r in caplog.records if "no longer declared" in r.getMessage()]
    assert warning.schedule_names == ["gone"]
    assert rl.get_schedule(defined, "gone").is_active is True
    new.sync_definitions(defined, deactivate_undeclared_schedules=True)
    assert rl.get_schedule(defined, "gone").is_active is False
    assert rl.get_schedule(defined, "made-by-api").is_active is True


def test_trigger_enqueues_one_extra_fire_now_and_leaves_the_next_fire(defined):
    schedule = rl.upsert_schedule(defined, "t", cron_expr="0 0 3 * * *", job_type=JOB_TYPE, is_active=False)
    job = rl.trigger_schedule(defined, "t")
    assert job.payload["_schedule"]["schedule_name"] == "t" and job.stage is rl.JobStage.SCHEDULED
    after = rl.get_schedule(defined, "t")
    assert after.next_fire_at == schedule.next_fire_at and after.last_fired_at is not None


def test_jitter_is_stored_in_the_next_fire_within_its_bound(defined):
    schedule = rl.upsert_schedule(defined, "j", cron_expr=EVERY_MINUTE, job_type=JOB_TYPE, max_jitter_seconds=30)
    instant = schedule.next_fire_at.replace(second=0, microsecond=0)
    assert schedule.next_fire_at == instant + timedelta(seconds=jitter_seconds(schedule.id, instant, 30))


def test_concurrent_ticks_fire_each_due_schedule_once(defined):
    # Daily, so that a tick loop still running when the minute turns finds nothing due again.
    for n in range(40):
        rl.upsert_schedule(defined, f"c{n}", cron_expr="0 0 * * *", job_type=JOB_TYPE)
    with defined.begin() as conn:
        conn.exec_driver_sql("UPDATE job_schedules SET next_fire_at = now() - interval '1 second'")
    start = threading.Barrier(4)
    fired: list[int] = []

    def tick() -> None:
        start.wait()
        while (result := fire_due_schedules(defined, limit=4)).fired or result.full:
            fired.append(result.fired)

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(fired) == 40
    assert scalar(defined, "SELECT count(DISTINCT payload -> '_schedule' ->> 'schedule_name') FROM job_queue") == 40
    assert job_count(defined) == 40
