"""Supervisor.health() and the metrics port's probes: each loop alive, its last successful step, the database."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from sqlalchemy.engine import make_url

import runledger_sync as rl
from runledger_sync.metrics import registry_for, serve_metrics
from runledger_sync.runtime.loops import reaper as reaper_module
from runledger_sync.runtime.supervisor import supervisor as supervisor_module
from tests.faults.harness import TcpProxy
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


# -- probes: liveness from the loops, readiness with the database ---------------------------

def _get(url: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - a local test server
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    return status, json.loads(body), time.monotonic() - started


def test_health_answers_never_name_the_database_user_host_name_or_password(engine):
    secret_parts = ("zq_user_q7", "zq_pw_q7", "zq-host-q7", "zq_db_q7")
    broken = rl.create_engine("postgresql://zq_user_q7:zq_pw_q7@zq-host-q7.invalid:5432/zq_db_q7")
    supervisor = rl.Supervisor(broken, _registry(engine), fast_config())
    server = serve_metrics(registry_for(broken), 0, health=supervisor.health)
    try:
        health = supervisor.health()
        ready_status, ready, _ = _get(f"http://127.0.0.1:{server.port}/readyz")
        live_status, live, _ = _get(f"http://127.0.0.1:{server.port}/health")
    finally:
        server.close()
        supervisor.stop()
        broken.dispose()

    assert not health.database_reachable and not health.ready
    assert health.database_error == "db.connection_failed: the database did not answer"
    assert ready_status == 503 and ready["database_reachable"] is False
    assert live_status == 503 and "database_error" not in live  # not started: no loop runs
    for shown in (json.dumps(health.as_dict()), json.dumps(ready), json.dumps(live)):
        assert not [part for part in secret_parts if part in shown], shown


def test_liveness_and_readiness_answer_200_at_once_while_another_client_holds_every_server_connection(
        engine, fresh_database):
    jobs = _registry(engine)
    proxy = TcpProxy(fresh_database)
    proxied = rl.create_engine(proxy.url_for(fresh_database))
    supervisor = rl.Supervisor(proxied, jobs, fast_config())
    server = serve_metrics(registry_for(proxied), 0, health=supervisor.health)
    base = f"http://127.0.0.1:{server.port}"
    try:
        supervisor.start()
        warm = [job.id for job in rl.enqueue_many(engine, [rl.JobSpec("health.noop", {}) for _ in range(50)])]
        wait_until(lambda: _count_succeeded(engine, warm) == len(warm), timeout=60)
        # Another client took every connection slot the server has: the worker's
        # open connections go on working, no new one can be opened.
        proxy.refuse_new()
        ids = [job.id for job in rl.enqueue_many(engine, [rl.JobSpec("health.noop", {}) for _ in range(300)])]
        answers = {path: _get(f"{base}{path}") for path in ("/livez", "/health", "/readyz")}
        wait_until(lambda: _count_succeeded(engine, ids) == len(ids), timeout=60)
        after = {f"{path} after": _get(f"{base}{path}") for path in ("/livez", "/readyz")}
    finally:
        server.close()
        supervisor.stop()
        proxied.dispose()
        proxy.close()

    for path, (status, body, seconds) in (answers | after).items():
        assert status == 200 and body["live"] and seconds < 3, (path, status, body, seconds)
    assert answers["/readyz"][1]["ready"] and answers["/readyz"][1]["database_reachable"]
    assert "ready" not in answers["/livez"][1]  # liveness does not ask the database


def test_a_stopped_database_keeps_liveness_200_and_makes_readiness_503_without_naming_it(engine, fresh_database):
    jobs = _registry(engine)
    proxy = TcpProxy(fresh_database)
    proxied_url = proxy.url_for(fresh_database)
    proxied = rl.create_engine(proxied_url)
    supervisor = rl.Supervisor(proxied, jobs, fast_config())
    server = serve_metrics(registry_for(proxied), 0, health=supervisor.health)
    base = f"http://127.0.0.1:{server.port}"
    try:
        supervisor.start()
        wait_until(lambda: supervisor.health(check_database=False).loops["worker"].last_success_at)
        assert _get(f"{base}/readyz")[0] == 200
        proxy.refuse()  # the server is down: connections reset, new ones refused
        down = wait_until(lambda: (lambda got: got if got[0] == 503 else None)(_get(f"{base}/readyz")), timeout=30)
        live = _get(f"{base}/livez")
        proxy.heal()
        back = wait_until(lambda: (lambda got: got if got[0] == 200 else None)(_get(f"{base}/readyz")), timeout=30)
    finally:
        server.close()
        supervisor.stop()
        proxied.dispose()
        proxy.close()

    assert down[1]["live"] and not down[1]["ready"] and not down[1]["database_reachable"]
    assert down[2] < 5  # bounded, not a pool or connect timeout
    assert live[0] == 200 and live[1]["live"]
    assert back[1]["ready"]
    url = make_url(proxied_url)
    shown = json.dumps(down[1])
    assert not [part for part in (url.database, url.username, str(url.port)) if part in shown], shown


def _count_succeeded(engine, ids) -> int:
    return sum(1 for job_id in ids if rl.get_job(engine, job_id).status is rl.JobStatus.SUCCEEDED)


def test_a_loop_that_stopped_turning_is_not_live(engine, monkeypatch):
    stuck = threading.Event()
    release = threading.Event()

    def hang(*_args):
        stuck.set()
        release.wait(30)

    # A sweep that never comes back, as a statement on a dead socket would not.
    monkeypatch.setattr(reaper_module, "reap_once", hang)
    monkeypatch.setattr(supervisor_module, "STALL_ALLOWANCE_SECONDS", 0.5)
    supervisor = rl.Supervisor(engine, _registry(engine), fast_config(), run_scheduler=False)
    try:
        supervisor.start()
        stuck.wait(10)
        stalled = wait_until(lambda: (lambda h: h if not h.live else None)(supervisor.health(check_database=False)))
    finally:
        release.set()
        supervisor.stop()

    assert stalled.loops["reaper"].alive and stalled.loops["reaper"].stalled
    assert stalled.loops["worker"].alive and not stalled.loops["worker"].stalled
    assert not stalled.healthy and not stalled.as_dict(database=False)["live"]
