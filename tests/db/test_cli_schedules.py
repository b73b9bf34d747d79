"""The ``schedules`` commands against a real PostgreSQL: what they print and the rows they leave."""

from __future__ import annotations

import json
from datetime import timezone

import pytest

import runledger_sync as rl
from runledger_sync.store.maintenance.schedule_tick import fire_due_schedules
from tests.support import define, scalar, wait_until

REPORT = "cli.report"


@pytest.fixture
def db(engine):
    define(engine, REPORT)
    rl.upsert_schedule(engine, "nightly", cron_expr="0 30 2 * * *", job_type=REPORT, timezone="Europe/Berlin",
                       payload_template={"kind": "daily"})
    rl.upsert_schedule(engine, "hourly", cron_expr="@hourly", job_type=REPORT)
    return engine


def test_list_prints_each_schedule_with_its_state_and_next_fire(db, run):
    code, out, _ = run("schedules", "list")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split()[:4] == ["name", "cron", "zone", "type"]
    assert [line.split()[0] for line in lines if line.strip() and not line.startswith("-")] == ["hourly", "nightly"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "Europe/Berlin" in nightly and "active" in nightly


def test_show_gives_the_next_fire_in_utc_and_in_the_schedules_zone(db, run):
    code, out, _ = run("schedules", "show", "nightly")
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["state"].strip() == "active"
    next_fire = fields["next_fire"]
    assert "02:30:00 CE" in next_fire  # 02:30 in Berlin, CET or CEST by the date
    assert fields["last_error"].strip() == "-"


def test_pause_resume_trigger_and_delete_change_the_rows(db, run):
    code, out, _ = run("schedules", "pause", "nightly")
    assert code == 0 and rl.get_schedule(db, "nightly").is_active is False
    assert out.strip() == "nightly paused; it fires no more until resumed"  # no "next fire" it will not keep
    code, out, _ = run("schedules", "list", "--paused", "--json")
    assert code == 0 and [json.loads(line)["name"] for line in out.splitlines()] == ["nightly"]
    code, out, _ = run("schedules", "resume", "nightly")
    assert code == 0 and rl.get_schedule(db, "nightly").is_active is True
    assert out.startswith("nightly resumed; next fire ")
    code, out, _ = run("schedules", "trigger", "hourly")
    assert code == 0
    job = rl.get_job(db, out.strip())
    assert job.payload["_schedule"]["schedule_name"] == "hourly"
    assert run("schedules", "delete", "hourly")[0] == 0
    assert scalar(db, "SELECT count(*) FROM job_schedules") == 1


def test_an_unknown_name_fails_with_its_code_and_a_hint(db, run):
    code, _, err = run("schedules", "pause", "no-such")
    assert code == 1
    assert err.splitlines()[0] == "error: schedule.not_found: no schedule is named 'no-such'"
    assert "schedules list" in err.splitlines()[1]


def test_a_failing_schedule_shows_its_last_error(db, run):
    rl.set_job_definition_enabled(db, REPORT, False)
    with db.begin() as conn:
        conn.exec_driver_sql("UPDATE job_schedules SET next_fire_at = now() - interval '1 second' WHERE name = 'hourly'")
    fire_due_schedules(db, limit=16)
    _, out, _ = run("schedules", "show", "hourly")
    assert "job.definition_not_found_or_disabled" in out


def test_a_schedule_that_fired_its_last_instant_shows_as_finished(db, run):
    last = scalar(db, "SELECT date_trunc('second', now()) + interval '1 second'").astimezone(timezone.utc)
    rl.upsert_schedule(db, "once", job_type=REPORT,
                       cron_expr=f"{last.second} {last.minute} {last.hour} {last.day} {last.month} * {last.year}")
    wait_until(lambda: fire_due_schedules(db, limit=16).fired, timeout=10)
    code, out, _ = run("schedules", "list", "--paused")
    assert code == 0
    [row] = [line for line in out.splitlines() if line.startswith("once")]
    assert "finished" in row.split()
    assert run("schedules", "pause", "nightly")[0] == 0
    _, out, _ = run("schedules", "show", "nightly")
    assert dict(line.split(":", 1) for line in out.splitlines())["state"].strip() == "paused"


def test_a_worker_whose_app_declares_a_schedule_of_an_unknown_type_names_both(engine, run):
    code, _, err = run("worker", "--app", "tests.cli_app:unknown_type")
    assert code == 1
    first, hint = err.splitlines()[:2]
    assert first.startswith("error: job.definition_not_found: schedule 'cli.orphan' names job type "
                            "'cli.no_such_type', which has no definition")
    assert hint.startswith("hint: register a handler for the job type")
    assert scalar(engine, "SELECT count(*) FROM job_schedules") == 0


def test_delete_refuses_a_schedule_declared_in_code_unless_forced(db, run):
    registry = rl.JobRegistry()
    registry.job(REPORT)(lambda ctx, payload: None)
    registry.schedule("declared", cron="@daily", job_type=REPORT)
    registry.sync_definitions(db)
    code, _, err = run("schedules", "delete", "declared")
    assert code == 1
    first, hint = err.splitlines()[:2]
    assert first.startswith("error: schedule.declared_in_code: schedule 'declared' is declared in code")
    assert "schedules pause NAME" in hint and "--force" in hint
    assert rl.get_schedule(db, "declared") is not None
    code, out, _ = run("schedules", "delete", "declared", "--force")
    assert (code, out.strip()) == (0, "declared deleted")
    assert rl.get_schedule(db, "declared") is None
