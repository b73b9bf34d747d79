"""Supervisor.health(): each loop alive, its last successful claim, sweep or tick, and the database."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import runledger_sync as rl
from tests.handlers import fast_config
from tests.support import wait_until


def _registry(engine) -> rl.JobRegistry:
    jobs = rl.JobRegistry()
    jobs.job("health.noop")(lambda ctx, payload: None)
    jobs.sync_definitions(engine)
    return jobs


def test_health_before_start_reports_no_loop_alive(engine):
    health = rl.Supervisor(engine, _registry(engine), fast_config(), run_scheduler=False).health()

    assert set(health.loops) == {"worker", "reaper"}
    assert not any(loop.alive or loop.last_success_at for loop in health.loops.values())
    assert health.database_reachable and not health.healthy


def test_health_reports_loops_alive_and_their_last_successful_steps(engine):
    supervisor = rl.Supervisor(engine, _registry(engine), fast_config())
    before = datetime.now(timezone.utc)
    with supervisor:
        health = wait_until(lambda: _all_stepped(supervisor.health()))
        job = rl.enqueue(engine, "health.noop", {})
        wait_until(lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
        first_claim = health.loops["worker"].last_success_at
        later = wait_until(lambda: (lambda h: h if h.loops["worker"].last_success_at > first_claim else None)(
            supervisor.health()))

    assert health.healthy and health.database_reachable and health.database_error is None
    assert {name for name, loop in health.loops.items() if loop.alive} == {"worker", "reaper", "scheduler", "listener"}
    for name in ("worker", "reaper", "scheduler"):
        assert before <= health.loops[name].last_success_at <= datetime.now(timezone.utc)
    assert later.loops["worker"].alive
    stopped = supervisor.health()
    assert not stopped.healthy
    assert not any(stopped.loops[name].alive for name in ("worker", "reaper", "scheduler"))
    assert stopped.loops["worker"].exit == repr(rl.RuntimeLoopExit.SHUTDOWN)
    as_dict = later.as_dict()
    assert as_dict["healthy"] is True and as_dict["loops"]["worker"]["alive"] is True
    assert datetime.fromisoformat(as_dict["loops"]["worker"]["last_success_at"]) == later.loops["worker"].last_success_at


def _all_stepped(health: rl.SupervisorHealth):
    loops = health.loops
    stepped = all(loops[name].last_success_at is not None for name in ("worker", "reaper", "scheduler"))
    return health if stepped and "listener" in loops and loops["listener"].alive else None


def test_health_reports_an_unreachable_database(engine):
    broken = rl.create_engine("postgresql://nobody@127.0.0.1:1/nothing")
    try:
        started = time.monotonic()
        health = rl.Supervisor(broken, _registry(engine), fast_config()).health()
        elapsed = time.monotonic() - started
    finally:
        broken.dispose()

    assert not health.database_reachable and not health.healthy
    assert health.database_error.startswith("db.connection_failed")
    assert elapsed < 15


def test_health_can_skip_the_database(engine):
    broken = rl.create_engine("postgresql://nobody@127.0.0.1:1/nothing")
    try:
        health = rl.Supervisor(broken, _registry(engine), fast_config()).health(check_database=False)
    finally:
        broken.dispose()

    assert health.database_reachable and health.database_error is None


def test_health_with_worker_processes_reports_each_process(engine):
    from tests import cli_app

    cli_app.registry.sync_definitions(engine)
    supervisor = rl.Supervisor(engine, cli_app.registry, fast_config(worker_id="health"), processes=2,
                               app="tests.cli_app:registry")
    supervisor.start()
    try:
        # Spawning imports the library afresh in each child: allow for a busy 2-core machine.
        running = wait_until(lambda: (lambda h: h if len(h.loops) == 2 and all(
            loop.alive for loop in h.loops.values()) else None)(supervisor.health()), timeout=60)
    finally:
        assert supervisor.stop(timeout=30)

    assert set(running.loops) == {"health-p0", "health-p1"} and running.healthy
    stopped = supervisor.health()
    assert not stopped.healthy
    # A child stopped while still importing ends by the signal itself (-15), one that got as far as
    # its drain with 0: either way health shows the status the supervisor recorded.
    assert {name: (loop.alive, loop.exit) for name, loop in stopped.loops.items()} == {
        name: (False, str(status)) for name, status in supervisor.exits.items()}
    assert set(supervisor.exits) == {"health-p0", "health-p1"}
