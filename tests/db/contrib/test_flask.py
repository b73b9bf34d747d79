"""The Flask extension against a real Flask app and a real PostgreSQL."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import flask
import pytest
import sqlalchemy as sa

import runledger_sync as rl
from runledger_sync.contrib import flask as rl_flask
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.metrics import WorkerMetrics
from tests.db.test_docs import marked
from tests.support import scalar, wait_until

JOB_TYPE = "flask.note_created"
APP_NAME = "rl_flask_test_app"

#: What the handler saw: (current_app.name, payload), one entry per run.
seen: list[tuple[str, Any]] = []
registry = rl.JobRegistry()


@registry.job(JOB_TYPE)
def note_created(ctx: rl.JobContext, payload: Any) -> None:
    seen.append((flask.current_app.name, payload))


metadata = sa.MetaData()
notes = sa.Table("app_notes", metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("body", sa.Text))

#: Short intervals, given the way an app would: as RUNLEDGER_<FIELD> config keys.
FAST_APP_CONFIG = {
    "RUNLEDGER_POLL_INTERVAL_MS": 20,
    "RUNLEDGER_LEASE_TTL_SECONDS": 5,
    "RUNLEDGER_HEARTBEAT_INTERVAL_SECONDS": 0.5,
    "RUNLEDGER_REAPER_INTERVAL_SECONDS": 0.2,
}


def make_app(url: str, *, observer: Any = None, **config: Any) -> tuple[Any, rl_flask.Runledger]:
    app = flask.Flask(APP_NAME)
    app.config.update(RUNLEDGER_DATABASE_URL=url, **FAST_APP_CONFIG)
    app.config.update(config)
    ext = rl_flask.Runledger(app, registry, observer=observer)

    @app.post("/notes")
    def create_note() -> Any:
        with ext.engine.begin() as conn:
            conn.execute(notes.insert().values(body=flask.request.json["body"]))
            job = ext.enqueue(JOB_TYPE, {"body": flask.request.json["body"]}, connection=conn)
        return {"job_id": str(job.id)}, 201

    @app.post("/notes-broken")
    def create_note_then_fail() -> Any:
        with ext.engine.begin() as conn:
            conn.execute(notes.insert().values(body="lost"))
            ext.enqueue(JOB_TYPE, {"body": "lost"}, connection=conn)
            raise RuntimeError("the view fails after enqueueing")

    @app.get("/ping")
    def ping() -> Any:
        return "pong"

    return app, ext


@pytest.fixture(autouse=True)
def clear_seen() -> Iterator[None]:
    seen.clear()
    yield
    seen.clear()


@pytest.fixture
def app_and_ext(fresh_database: str) -> Iterator[tuple[Any, rl_flask.Runledger]]:
    app, ext = make_app(fresh_database)
    metadata.create_all(ext.engine)
    ext.sync_definitions(app)
    yield app, ext
    assert ext.stop_worker(app, timeout=10)
    ext.engine.dispose()


def job_count(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue WHERE job_type = :t", t=JOB_TYPE)


def job_status(engine: Any, job_id: str) -> str:
    return scalar(engine, "SELECT status FROM job_queue WHERE id = :id", id=job_id)


def test_view_commit_enqueues_and_worker_runs_job_in_app_context(app_and_ext):
    app, ext = app_and_ext
    response = app.test_client().post("/notes", json={"body": "hello"})
    assert response.status_code == 201
    job_id = response.get_json()["job_id"]
    assert scalar(ext.engine, "SELECT count(*) FROM app_notes") == 1
    assert job_status(ext.engine, job_id) == "PENDING"

    supervisor = rl.Supervisor(
        ext.engine,
        rl_flask.in_app_context(registry, app),
        rl.JobsConfig(poll_interval_ms=20, lease_ttl_seconds=5, heartbeat_interval_seconds=0.5,
                      reaper_interval_seconds=0.2),
    )
    with supervisor:
        wait_until(lambda: job_status(ext.engine, job_id) == "SUCCEEDED")
    assert seen == [(APP_NAME, {"body": "hello"})]


def test_view_raising_after_enqueue_leaves_no_job(app_and_ext):
    app, ext = app_and_ext
    response = app.test_client().post("/notes-broken")
    assert response.status_code == 500
    assert job_count(ext.engine) == 0
    assert scalar(ext.engine, "SELECT count(*) FROM app_notes") == 0


def test_enqueue_without_connection_commits_on_the_app_engine(app_and_ext):
    app, ext = app_and_ext
    with app.app_context():
        job = ext.enqueue(JOB_TYPE, {"body": "direct"}, priority=5)
    assert rl.get_job(ext.engine, job.id).priority == 5


def test_enqueue_follows_the_apps_event_log_level(fresh_database):
    app, ext = make_app(fresh_database, RUNLEDGER_EVENT_LOG="full")
    try:
        ext.sync_definitions(app)
        with app.app_context():
            one = ext.enqueue(JOB_TYPE, {"body": "one"})
            [many] = ext.enqueue_many([rl.JobSpec(JOB_TYPE, {"body": "many"})])
            quiet = ext.enqueue(JOB_TYPE, {"body": "asked"}, event_log="transitions")
        logged = scalar(ext.engine, "SELECT array_agg(job_id ORDER BY id) FROM job_events WHERE event_type = 'ENQUEUED'")
        assert logged == [one.id, many.id] and quiet.id not in logged
    finally:
        ext.engine.dispose()


def test_handlers_of_the_wrapped_registry_keep_their_retry_rules():
    wrapped = rl_flask.in_app_context(registry, flask.Flask("x"))
    assert wrapped.registered_types() == registry.registered_types()
    assert wrapped.definitions() == registry.definitions()
    assert wrapped.exception_rules(JOB_TYPE) == registry.exception_rules(JOB_TYPE)


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "runledger-worker" and t.is_alive()]


def test_autostart_worker_starts_once_on_first_request_and_stops_at_exit(fresh_database, monkeypatch):
    monkeypatch.delenv(rl_flask.RELOADER_CHILD_VARIABLE, raising=False)
    exit_hooks: list[tuple[Any, tuple[Any, ...]]] = []
    monkeypatch.setattr(rl_flask.atexit, "register", lambda fn, *args: exit_hooks.append((fn, args)))
    app, ext = make_app(fresh_database, RUNLEDGER_AUTOSTART_WORKER=True)
    metadata.create_all(ext.engine)
    before = len(worker_threads())
    try:
        # Not in the reloader child: nothing runs until a request is served.
        assert ext._state(app).supervisor is None
        client = app.test_client()
        assert client.get("/ping").status_code == 200
        first = ext._state(app).supervisor
        assert first is not None and first.running
        job_id = client.post("/notes", json={"body": "auto"}).get_json()["job_id"]
        for _ in range(3):
            assert client.get("/ping").status_code == 200
        assert ext._state(app).supervisor is first
        assert len(worker_threads()) == before + 1
        wait_until(lambda: job_status(ext.engine, job_id) == "SUCCEEDED")
        assert seen == [(APP_NAME, {"body": "auto"})]
        assert len(exit_hooks) == 1
        fn, args = exit_hooks[0]
        fn(*args)
        assert not first.running
    finally:
        ext.stop_worker(app, timeout=10)
        ext.engine.dispose()
    assert len(worker_threads()) == before


def test_autostart_in_reloader_child_starts_at_init_app(fresh_database, monkeypatch):
    monkeypatch.setenv(rl_flask.RELOADER_CHILD_VARIABLE, "true")
    app, ext = make_app(fresh_database, RUNLEDGER_AUTOSTART_WORKER=True)
    try:
        started = ext._state(app).supervisor
        assert started is not None and started.running
        app.test_client().get("/ping")
        assert ext._state(app).supervisor is started
        assert ext.stop_worker(app, timeout=10)
        assert not started.running
    finally:
        ext.stop_worker(app, timeout=10)
        ext.engine.dispose()


def test_no_autostart_by_default(app_and_ext):
    app, ext = app_and_ext
    app.test_client().get("/ping")
    assert ext._state(app).supervisor is None
    assert app.extensions["runledger"] is ext


def test_config_keys_override_jobs_config_and_database_url_falls_back(fresh_database):
    app = flask.Flask("config_app")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=fresh_database,
        RUNLEDGER_MAX_GLOBAL_CONCURRENCY=3,
        RUNLEDGER_POLL_INTERVAL_MS="25",
        RUNLEDGER_JOB_TYPES="a, b",
        RUNLEDGER_WORKER_ID="web-1",
    )
    ext = rl_flask.Runledger()
    ext.init_app(app)
    with app.app_context():
        assert ext.config.max_global_concurrency == 3
        assert ext.config.poll_interval_ms == 25
        assert ext.config.job_types == ("a", "b")
        assert ext.config.worker_id == "web-1"
        assert ext.engine.url.database == sa.engine.make_url(fresh_database).database
        assert rl.current_revision(ext.engine) == rl.head_revision()
        ext.engine.dispose()


def test_cli_migrate_upgrades_an_empty_database_and_writes_definitions(empty_database):
    app, ext = make_app(empty_database)
    try:
        result = app.test_cli_runner().invoke(args=["runledger", "migrate"])
        assert result.exit_code == 0, result.output
        assert "schema at" in result.output and "1 job definition" in result.output
        assert rl.current_revision(ext.engine) == rl.head_revision()
        assert scalar(ext.engine, "SELECT count(*) FROM job_definitions WHERE job_type = :t", t=JOB_TYPE) == 1
        again = app.test_cli_runner().invoke(args=["runledger", "migrate"])
        assert again.exit_code == 0 and "already up to date" in again.output
    finally:
        ext.engine.dispose()


def test_cli_worker_runs_jobs_until_sigterm(app_and_ext):
    app, ext = app_and_ext
    with app.app_context():
        job = ext.enqueue(JOB_TYPE, {"body": "cli"})
    done = threading.Event()

    def stop_when_done() -> None:
        # The job can only succeed while the command runs, so its signal handler is installed.
        try:
            wait_until(lambda: job_status(ext.engine, str(job.id)) == "SUCCEEDED", timeout=15)
        finally:
            done.set()
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=stop_when_done, daemon=True)
    watcher.start()
    result = app.test_cli_runner().invoke(args=["runledger", "worker", "--drain-timeout", "5"])
    watcher.join(5)
    assert done.is_set()
    assert result.exit_code == 0, result.output
    assert seen == [(APP_NAME, {"body": "cli"})]


def test_cli_worker_refuses_a_log_format_variable_it_does_not_know_with_a_usage_error(app_and_ext, monkeypatch):
    app, ext = app_and_ext
    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "xml")
    result = app.test_cli_runner().invoke(args=["runledger", "worker", "--drain-timeout", "5"])
    assert result.exit_code == 2, result.output
    assert "config.invalid: RUNLEDGER_LOG_FORMAT must be one of text, json, got 'xml'" in result.output
    assert "Traceback" not in result.output


def test_flask_sqlalchemy_session_joins_the_enqueue(fresh_database):
    flask_sqlalchemy = pytest.importorskip("flask_sqlalchemy")
    app = flask.Flask("fsa_app")
    app.config.update(SQLALCHEMY_DATABASE_URI=fresh_database)
    db = flask_sqlalchemy.SQLAlchemy(app)
    ext = rl_flask.Runledger(app, registry)

    class Note(db.Model):  # type: ignore[name-defined]
        __tablename__ = "fsa_notes"
        id = db.Column(db.Integer, primary_key=True)

    try:
        with app.app_context():
            db.create_all()
            ext.sync_definitions(app)
            db.session.add(Note())
            ext.enqueue(JOB_TYPE, {"body": "rolled back"}, connection=db.session)
            db.session.rollback()
            assert job_count(ext.engine) == 0
            db.session.add(Note())
            ext.enqueue(JOB_TYPE, {"body": "orm"}, connection=db.session)
            db.session.commit()
            assert job_count(ext.engine) == 1
    finally:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()
        ext.engine.dispose()


def test_pool_mode_key_builds_an_engine_that_neither_prepares_nor_listens(fresh_database):
    app = flask.Flask("pool_mode_app")
    app.config.update(RUNLEDGER_DATABASE_URL=fresh_database, RUNLEDGER_POOL_MODE="transaction")
    ext = rl_flask.Runledger(app, rl.JobRegistry())
    try:
        assert policy_of(ext.engine).mode is rl.PoolMode.TRANSACTION
        assert not policy_of(ext.engine).prepares and not policy_of(ext.engine).listens
    finally:
        ext.engine.dispose()
    bad = flask.Flask("bad_pool_mode_app")
    bad.config.update(RUNLEDGER_DATABASE_URL=fresh_database, RUNLEDGER_POOL_MODE="statement")
    with pytest.raises(rl.ConfigError, match="pool_mode must be one of session, transaction, got 'statement'"):
        rl_flask.Runledger(bad)


def succeeded_count(metrics: WorkerMetrics) -> float:
    return sum(sample.value for family in metrics.collect() for sample in family.samples
               if sample.name == "runledger_jobs_total" and sample.labels == {"job_type": JOB_TYPE,
                                                                               "outcome": "succeeded"})


def test_in_process_worker_counts_its_jobs_for_the_observer_the_config_key_names(fresh_database):
    metrics, ignored = WorkerMetrics(), WorkerMetrics()
    app, ext = make_app(fresh_database, observer=ignored, RUNLEDGER_OBSERVER=metrics)
    metadata.create_all(ext.engine)
    try:
        ext.start_worker(app)
        client = app.test_client()
        job_ids = [client.post("/notes", json={"body": body}).get_json()["job_id"] for body in ("a", "b")]
        wait_until(lambda: all(job_status(ext.engine, job_id) == "SUCCEEDED" for job_id in job_ids))
        # The counter moves just after the success commits, on the job's own thread.
        wait_until(lambda: succeeded_count(metrics) == 2)
    finally:
        assert ext.stop_worker(app, timeout=10)
        ext.engine.dispose()
    assert succeeded_count(metrics) == 2 and succeeded_count(ignored) == 0  # the app's key wins


def test_cli_worker_counts_its_jobs_for_the_extensions_observer(fresh_database):
    metrics = WorkerMetrics()
    app, ext = make_app(fresh_database, observer=metrics)
    ext.sync_definitions(app)
    with app.app_context():
        job = ext.enqueue(JOB_TYPE, {"body": "counted"})

    def stop_when_counted() -> None:
        try:
            wait_until(lambda: succeeded_count(metrics) == 1, timeout=15)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=stop_when_counted, daemon=True)
    watcher.start()
    try:
        result = app.test_cli_runner().invoke(args=["runledger", "worker", "--drain-timeout", "5"])
        watcher.join(5)
        status = job_status(ext.engine, str(job.id))
    finally:
        ext.engine.dispose()
    assert result.exit_code == 0, result.output
    assert status == "SUCCEEDED" and succeeded_count(metrics) == 1


def test_the_documented_flask_metrics_snippet_counts_the_in_process_workers_jobs(fresh_database):
    app = flask.Flask(APP_NAME)
    app.config.update(RUNLEDGER_DATABASE_URL=fresh_database, **FAST_APP_CONFIG)
    namespace = {"flask_app": app, "registry": registry, "Runledger": rl_flask.Runledger}
    exec(compile(marked("metrics-frameworks", "python"), "docs:metrics-frameworks", "exec"), namespace)  # noqa: S102
    ext = namespace["runledger"]
    try:
        ext.sync_definitions(app)
        with app.app_context():
            job = ext.enqueue(JOB_TYPE, {"body": "documented"})
        ext.start_worker(app)
        wait_until(lambda: job_status(ext.engine, str(job.id)) == "SUCCEEDED")
        scraped = namespace["metrics_registry"]
        wait_until(lambda: scraped.get_sample_value(
            "runledger_jobs_total", {"job_type": JOB_TYPE, "outcome": "succeeded"}) == 1)
    finally:
        assert ext.stop_worker(app, timeout=10)
        ext.engine.dispose()
    assert scraped.get_sample_value("runledger_queue_up") == 1
