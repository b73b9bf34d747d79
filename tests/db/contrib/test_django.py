"""The Django app against a real Django setup and a real PostgreSQL.

django.setup() configures settings once per process, so every Django test lives
in this module, on databases made for it by a module-scoped fixture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import runledger_sync as rl
from runledger_sync.contrib.django.settings import database_url, read_settings
from runledger_sync.db.pool_mode import policy_of
from tests.support import scalar, wait_until

django = pytest.importorskip("django")

from django.conf import settings  # noqa: E402 - only once Django is known to be installed
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.management import CommandError, call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

from tests.db.contrib import django_jobs, django_settings  # noqa: E402 - imports Django

JOB_TYPE = django_jobs.JOB_TYPE


def django_database(url: str) -> dict[str, Any]:
    """A DATABASES entry for a test database URL (the embedded server's is a socket directory)."""
    parsed = sa.engine.make_url(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "postgres",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.query.get("host") or parsed.host or "",
        "PORT": str(parsed.query.get("port") or parsed.port or ""),
    }


@pytest.fixture(scope="module")
def project(pg_server, template_database) -> Iterator[None]:
    if settings.configured:
        pytest.skip("Django settings were already configured in this process")
    main, empty = f"rl_django_{os.getpid()}", f"rl_django_empty_{os.getpid()}"
    unmigrated = f"rl_django_unmigrated_{os.getpid()}"  # stays empty, unlike "empty", which a test migrates
    url = pg_server.create_database(main, template=template_database, drop_existing=True)
    empty_url = pg_server.create_database(empty, drop_existing=True)
    unmigrated_url = pg_server.create_database(unmigrated, drop_existing=True)
    settings.configure(
        DATABASES={"default": django_database(url), "empty": django_database(empty_url),
                   "unmigrated": django_database(unmigrated_url)},
        **django_settings.SETTINGS,
    )
    django.setup()
    from runledger_sync.contrib import django as runledger

    runledger.get_registry().sync_definitions(runledger.get_engine())
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE app_orders (id serial PRIMARY KEY, item text NOT NULL)")
    try:
        yield
    finally:
        connections.close_all()
        django.apps.apps.get_app_config("runledger").dispose()
        for name in (main, empty, unmigrated):
            pg_server.drop_database(name)


@pytest.fixture
def runledger(project) -> Iterator[Any]:
    from runledger_sync.contrib import django as runledger

    engine = runledger.get_engine()
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE job_queue CASCADE")
        conn.exec_driver_sql("TRUNCATE app_orders")
    django_jobs.runs.clear()
    yield runledger
    django_jobs.runs.clear()


def job_count(engine: Any) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue WHERE job_type = :t", t=JOB_TYPE)


def order_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM app_orders")
        return cursor.fetchone()[0]


def place_order(runledger: Any, item: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO app_orders (item) VALUES (%s)", [item])
    return runledger.enqueue(JOB_TYPE, {"item": item})


def test_enqueue_inside_committed_atomic_block_creates_the_job(runledger):
    with transaction.atomic():
        job = place_order(runledger, "book")
        assert job.job_type == JOB_TYPE
    assert order_count() == 1
    assert rl.get_job(runledger.get_engine(), job.id).payload == {"item": "book"}


def test_atomic_block_raising_after_enqueue_leaves_no_job(runledger):
    with pytest.raises(RuntimeError, match="after enqueue"), transaction.atomic():
        place_order(runledger, "lost")
        raise RuntimeError("the view fails after enqueue")
    assert order_count() == 0
    assert job_count(runledger.get_engine()) == 0


def test_enqueue_outside_atomic_block_commits_at_once(runledger):
    job = runledger.enqueue(JOB_TYPE, {"item": "now"}, priority=7)
    assert rl.get_job(runledger.get_engine(), job.id).priority == 7


def test_enqueue_goes_through_the_raw_connection_of_the_driver_django_picked(runledger):
    psycopg = pytest.importorskip("psycopg")
    with transaction.atomic():
        job = place_order(runledger, "typed")
        # With psycopg 3 installed Django uses it (and loads jsonb as text on its
        # connection); the record read back through that connection is still decoded.
        assert isinstance(connection.connection, psycopg.Connection)
        assert rl.get_job(connection.connection, job.id).payload == {"item": "typed"}
        assert job.payload == {"item": "typed"} and job.created_at.tzinfo is not None
        with connection.cursor() as cursor:
            cursor.execute("SELECT payload FROM job_queue WHERE id = %s", [job.id])
            assert cursor.fetchone()[0] == '{"item": "typed"}'
    assert rl.get_job(runledger.get_engine(), job.id) is not None


#: Run in a fresh interpreter: Django picks its driver once, at import, and
#: prefers psycopg 3, so hiding psycopg makes it fall back to psycopg2.
ON_PSYCOPG2 = """
import json, sys
sys.modules["psycopg"] = None
import django
from django.conf import settings
from tests.db.contrib import django_settings
settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, **django_settings.SETTINGS)
django.setup()
import psycopg2.extensions
from django.db import connection, transaction
from runledger_sync.contrib import django as runledger
from tests.db.contrib.django_jobs import JOB_TYPE
with transaction.atomic():
    kept = runledger.enqueue(JOB_TYPE, {"item": "kept"})
    assert isinstance(connection.connection, psycopg2.extensions.connection), type(connection.connection)
    assert kept.payload == {"item": "kept"}
try:
    with transaction.atomic():
        lost = runledger.enqueue(JOB_TYPE, {"item": "lost"})
        raise RuntimeError("the view fails after enqueue")
except RuntimeError:
    pass
print(json.dumps({"kept": str(kept.id), "lost": str(lost.id)}))
"""


def test_enqueue_joins_django_transactions_on_psycopg2_too(runledger):
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", ON_PSYCOPG2, json.dumps(settings.DATABASES["default"])],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    ids = json.loads(done.stdout)
    engine = runledger.get_engine()
    assert rl.get_job(engine, ids["kept"]).payload == {"item": "kept"}
    assert rl.get_job(engine, ids["lost"]) is None


def test_runledger_migrate_command_upgrades_an_empty_database(runledger):
    empty = runledger.get_engine("empty")
    assert rl.current_revision(empty) is None
    out = io.StringIO()
    call_command("runledger_migrate", database="empty", stdout=out)
    assert "migrated from an empty database" in out.getvalue()
    # Says what it wrote besides the schema, as `runledger-sync migrate --app` and `flask runledger migrate` do.
    assert "; 1 job definition(s) and 0 schedule(s) written" in out.getvalue()
    assert rl.current_revision(empty) == rl.head_revision()
    assert scalar(empty, "SELECT count(*) FROM job_definitions WHERE job_type = :t", t=JOB_TYPE) == 1
    out = io.StringIO()
    call_command("runledger_migrate", database="empty", stdout=out)
    assert "already up to date" in out.getvalue()


def test_worker_handler_wrapper_closes_old_connections_before_and_after(runledger):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert connection.connection is not None  # a connection left open, as after a request
    handler = runledger.with_django_connections(runledger.get_registry()).get(JOB_TYPE)
    handler.execute(None, {"item": "direct"})
    [(was_open, used, payload)] = django_jobs.runs
    assert not was_open, "the stale connection was not closed before the handler ran"
    assert used is connections["default"] and used.connection is None, "the handler's connection was not closed after it"
    assert payload == {"item": "direct"}


def test_worker_runs_jobs_with_django_connections_closed_after_each(runledger):
    engine = runledger.get_engine()
    job = rl.enqueue(engine, JOB_TYPE, {"item": "worker"})
    supervisor = runledger.build_supervisor()
    assert supervisor.config.poll_interval_ms == 20
    with supervisor:
        wait_until(lambda: rl.get_job(engine, job.id).status == rl.JobStatus.SUCCEEDED)
    [(_was_open, used, payload)] = django_jobs.runs
    assert payload == {"item": "worker"}
    assert used is not connections["default"]  # the pool thread's own connection, not the test's
    assert used.connection is None


def test_runledger_worker_command_runs_until_sigterm(runledger):
    engine = runledger.get_engine()
    job = rl.enqueue(engine, JOB_TYPE, {"item": "command"})
    done = threading.Event()

    def stop_when_done() -> None:
        # The job can only succeed while the command runs, so its signal handler is installed.
        try:
            wait_until(lambda: rl.get_job(engine, job.id).status == rl.JobStatus.SUCCEEDED, timeout=15)
        finally:
            done.set()
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=stop_when_done, daemon=True)
    watcher.start()
    call_command("runledger_worker", "--drain-timeout", "5", "--concurrency", "2")
    watcher.join(5)
    assert done.is_set()
    assert [run[2] for run in django_jobs.runs] == [{"item": "command"}]


def succeeded_count(metrics: Any) -> float:
    return sum(sample.value for family in metrics.collect() for sample in family.samples
               if sample.name == "runledger_jobs_total" and sample.labels == {"job_type": JOB_TYPE,
                                                                               "outcome": "succeeded"})


@contextlib.contextmanager
def observer_setting(value: Any) -> Iterator[None]:
    app_config = django.apps.apps.get_app_config("runledger")
    configured = app_config.runledger_settings
    app_config.runledger_settings = dataclasses.replace(configured, observer=value)
    try:
        yield
    finally:
        app_config.runledger_settings = configured


def test_runledger_worker_command_counts_its_jobs_for_the_observer_the_setting_names(runledger):
    engine = runledger.get_engine()
    metrics = django_jobs.worker_metrics
    before = succeeded_count(metrics)
    job = rl.enqueue(engine, JOB_TYPE, {"item": "counted"})

    def stop_when_counted() -> None:
        # The counter can only move while the command runs, so its signal handler is installed.
        try:
            wait_until(lambda: succeeded_count(metrics) == before + 1, timeout=15)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=stop_when_counted, daemon=True)
    with observer_setting("tests.db.contrib.django_jobs:worker_metrics"):
        assert runledger.get_observer() is metrics
        watcher.start()
        call_command("runledger_worker", "--drain-timeout", "5")
    watcher.join(5)
    assert rl.get_job(engine, job.id).status == rl.JobStatus.SUCCEEDED
    assert succeeded_count(metrics) == before + 1


def test_build_supervisor_counts_its_jobs_for_an_observer_object_in_the_setting(runledger):
    from runledger_sync.metrics import WorkerMetrics

    engine = runledger.get_engine()
    metrics = WorkerMetrics()
    jobs = [rl.enqueue(engine, JOB_TYPE, {"item": item}) for item in ("a", "b")]
    with observer_setting(metrics), runledger.build_supervisor():
        wait_until(lambda: all(rl.get_job(engine, job.id).status == rl.JobStatus.SUCCEEDED for job in jobs))
        wait_until(lambda: succeeded_count(metrics) == 2)
    assert succeeded_count(metrics) == 2


def test_an_observer_setting_that_is_neither_a_name_nor_an_observer_is_reported():
    class Settings:
        RUNLEDGER = {"OBSERVER": "no_colon"}  # noqa: RUF012 - a settings stub

    with pytest.raises(ImproperlyConfigured, match=r"OBSERVER'\] must be 'module:attribute' or an observer"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"OBSERVER": object()}
    with pytest.raises(ImproperlyConfigured, match="OBSERVER"):
        read_settings(Settings)


def test_runledger_worker_command_refuses_a_log_format_variable_it_does_not_know(runledger, monkeypatch):
    monkeypatch.setenv("RUNLEDGER_LOG_FORMAT", "xml")
    with pytest.raises(CommandError, match="RUNLEDGER_LOG_FORMAT must be one of text, json, got 'xml'") as refused:
        call_command("runledger_worker", "--drain-timeout", "5")
    assert refused.value.returncode == 2


def test_database_url_is_built_from_a_databases_entry():
    socket = database_url({"ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "u",
                           "PASSWORD": "p@ss", "HOST": "/run/pg", "PORT": "5433",
                           "OPTIONS": {"sslmode": "disable", "isolation_level": 1, "prepare_threshold": 0}})
    assert (socket.username, socket.password, socket.host, socket.port, socket.database) == ("u", "p@ss", None, 5433, "app")
    assert dict(socket.query) == {"host": "/run/pg", "sslmode": "disable"}
    tcp = database_url({"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db.local", "PORT": ""})
    assert (tcp.drivername, tcp.host, tcp.port, tcp.username) == ("postgresql+psycopg2", "db.local", None, None)
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL"):
        database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})


def test_bad_runledger_settings_are_reported():
    class Settings:
        RUNLEDGER = {"REGISTRY": "no_colon", "CONFIG": {}}  # noqa: RUF012 - a settings stub

    with pytest.raises(ImproperlyConfigured, match="module:registry"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"CONFIG": {"poll_interval": 5}}
    with pytest.raises(ImproperlyConfigured, match="poll_interval"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"QUEUE": "x"}
    with pytest.raises(ImproperlyConfigured, match="unknown keys"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"CONFIG": {"MAX_GLOBAL_CONCURRENCY": 4}, "SCHEMA": "jobs"}
    checked = read_settings(Settings)
    assert (checked.config, checked.schema, checked.database) == ({"max_global_concurrency": 4}, "jobs", "default")


def test_pool_mode_setting_reaches_the_queue_engine(project):
    class Settings:
        RUNLEDGER = {"POOL_MODE": "Transaction"}  # noqa: RUF012 - a settings stub

    assert read_settings(Settings).pool_mode is rl.PoolMode.TRANSACTION
    Settings.RUNLEDGER = {"POOL_MODE": "statement"}
    with pytest.raises(ImproperlyConfigured, match="POOL_MODE'] must be one of 'session', 'transaction'"):
        read_settings(Settings)
    app_config = django.apps.apps.get_app_config("runledger")
    configured = app_config.runledger_settings
    app_config.dispose()  # engines are built on first use: build them again under the new setting
    app_config.runledger_settings = dataclasses.replace(configured, pool_mode=rl.PoolMode.TRANSACTION)
    try:
        engine = app_config.get_engine("empty")
        assert policy_of(engine).mode is rl.PoolMode.TRANSACTION
    finally:
        app_config.runledger_settings = configured
        app_config.dispose()


# -- the dashboard (runledger_sync.contrib.django.urls) -----------------------------------------


def dead_lettered_job(engine: Any) -> rl.JobRecord:
    job = rl.enqueue(engine, JOB_TYPE, {"item": "lost"})
    with engine.begin() as conn:  # dead-letter it as a worker would have
        conn.exec_driver_sql("UPDATE job_queue SET status = 'DEAD_LETTERED', finished_at = now() WHERE id = %s",
                             (job.id,))
    return job


def django_csrf_token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "the page draws no form with Django's CSRF token"
    return found.group(1)


@contextlib.contextmanager
def dashboard_settings(**changes: Any) -> Iterator[None]:
    """Serve the dashboard under other RUNLEDGER settings for the block (it is rebuilt on each change)."""
    from runledger_sync.contrib.django import urls

    app_config = django.apps.apps.get_app_config("runledger")
    configured = app_config.runledger_settings
    dashboard = dataclasses.replace(configured.dashboard, **changes.pop("dashboard", {}))
    app_config.runledger_settings = dataclasses.replace(configured, dashboard=dashboard, **changes)
    urls._built.clear()
    try:
        yield
    finally:
        app_config.runledger_settings = configured
        urls._built.clear()


def test_dashboard_mounted_by_include_serves_pages_and_replays_for_the_hooks_operator(runledger):
    from django.test import Client

    engine = runledger.get_engine()
    job = dead_lettered_job(engine)
    client = Client(enforce_csrf_checks=True)
    overview = client.get("/ops/")
    assert overview.status_code == 200 and 'href="/ops/jobs"' in overview.content.decode()
    token = django_csrf_token(client.get("/ops/dead-letters", HTTP_X_OPERATOR="ada").content.decode())
    form = {"job_id": str(job.id), "csrfmiddlewaretoken": token}
    refused = client.post("/ops/dead-letters/replay", form, HTTP_ORIGIN="http://testserver")
    assert refused.status_code == 403 and "web.action_forbidden" in refused.content.decode()
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED
    done = client.post("/ops/dead-letters/replay", form, HTTP_X_OPERATOR="ada", HTTP_ORIGIN="http://testserver")
    assert done.status_code == 303 and done["Location"] == "/ops/dead-letters?replayed=1"
    assert rl.get_job(engine, job.id).status is rl.JobStatus.PENDING


def test_dashboard_forms_are_checked_by_djangos_csrf_protection(runledger):
    from django.test import Client

    engine = runledger.get_engine()
    job = dead_lettered_job(engine)
    client = Client(enforce_csrf_checks=True)
    page = client.get("/ops/dead-letters", HTTP_X_OPERATOR="ada")
    html = page.content.decode()
    token = django_csrf_token(html)
    assert 'name="csrf_token"' not in html and "runledger_csrf" not in page.cookies
    assert page["X-Frame-Options"] == "DENY" and page["X-Content-Type-Options"] == "nosniff"
    # Without Django's token, and then with it from another port of the same host: both refused by Django.
    missing = client.post("/ops/dead-letters/replay", {"job_id": str(job.id)}, HTTP_X_OPERATOR="ada")
    other_port = client.post("/ops/dead-letters/replay", {"job_id": str(job.id), "csrfmiddlewaretoken": token},
                             HTTP_X_OPERATOR="ada", HTTP_ORIGIN="http://testserver:8081")
    assert (missing.status_code, other_port.status_code) == (403, 403)
    assert b"CSRF" in missing.content and b"CSRF" in other_port.content
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_dashboard_answers_only_to_djangos_allowed_hosts(runledger):
    from django.test import Client

    engine = runledger.get_engine()
    job = dead_lettered_job(engine)
    client = Client(enforce_csrf_checks=True)
    token = django_csrf_token(client.get("/ops/dead-letters", HTTP_X_OPERATOR="ada").content.decode())
    # A page whose domain was re-pointed at this server (DNS rebinding): every request names that domain.
    read = client.get(f"/ops/jobs/{job.id}", HTTP_X_OPERATOR="ada", HTTP_HOST="evil.example")
    form = {"job_id": str(job.id), "csrfmiddlewaretoken": token}
    replay = client.post("/ops/dead-letters/replay", form, HTTP_X_OPERATOR="ada", HTTP_HOST="evil.example")
    # With the rebound Origin, Django's CSRF check refuses the form before the view is reached.
    with_origin = client.post("/ops/dead-letters/replay", form, HTTP_X_OPERATOR="ada", HTTP_HOST="evil.example",
                              HTTP_ORIGIN="http://evil.example")
    assert (read.status_code, replay.status_code, with_origin.status_code) == (400, 400, 403)
    assert str(job.id).encode() not in read.content
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_dashboard_default_hook_admits_staff_and_sends_anonymous_visitors_to_login(runledger):
    from django.test import Client

    client = Client()
    with dashboard_settings(dashboard={"authorize": None}):
        anonymous = client.get("/ops/jobs?status=PENDING")
        assert anonymous.status_code == 302
        assert anonymous["Location"] == "/accounts/login/?next=%2Fops%2Fjobs%3Fstatus%3DPENDING"
        not_staff = client.get("/ops/jobs", HTTP_X_USER="user:bob")
        assert not_staff.status_code == 403 and "web.action_forbidden" in not_staff.content.decode()
        assert client.get("/ops/jobs", HTTP_X_USER="staff:ada").status_code == 200


def test_dashboard_default_hook_without_the_authentication_middleware_is_a_configuration_error(runledger):
    from django.test import RequestFactory

    from runledger_sync.contrib.django import urls

    request = RequestFactory().get("/ops/jobs")  # no middleware ran: no request.user
    with dashboard_settings(dashboard={"authorize": None}), pytest.raises(ImproperlyConfigured) as raised:
        urls.dashboard(request, "jobs")
    message = str(raised.value)
    assert message.startswith("config.invalid: ")
    assert "AuthenticationMiddleware" in message and 'RUNLEDGER["DASHBOARD"]["AUTHORIZE"]' in message
    with dashboard_settings(dashboard={"authorize": "runledger_sync.web:allow_anyone"}):
        assert urls.dashboard(RequestFactory().get("/ops/jobs"), "jobs").status_code == 200  # a hook needs no user


def test_dashboard_read_only_refusal_names_the_django_setting(runledger):
    from django.test import Client

    job = dead_lettered_job(runledger.get_engine())
    client = Client(enforce_csrf_checks=True)
    with dashboard_settings(dashboard={"read_only": True}):
        client.get("/ops/", HTTP_X_OPERATOR="ada")  # a read-only page draws no form, but sets Django's cookie
        token = client.cookies["csrftoken"].value
        refused = client.post("/ops/dead-letters/replay", {"job_id": str(job.id), "csrfmiddlewaretoken": token},
                              HTTP_X_OPERATOR="ada")
    html = refused.content.decode()
    assert refused.status_code == 403 and 'id="error-code">web.read_only<' in html
    assert "RUNLEDGER[&#34;DASHBOARD&#34;][&#34;READ_ONLY&#34;] = False" in html and "create_app" not in html


def test_dashboard_on_an_unmigrated_database_answers_503_naming_the_migrate_command(runledger):
    from django.test import Client

    with dashboard_settings(database="unmigrated"):
        for path in ("/ops/", "/ops/jobs", "/ops/dead-letters"):
            response = Client().get(path)
            html = response.content.decode()
            assert response.status_code == 503, path
            assert 'id="error-code">db.schema_mismatch<' in html and "python manage.py runledger_migrate" in html
            assert response["X-Frame-Options"] == "DENY"


def test_a_missing_installed_apps_entry_is_a_clear_configuration_error(runledger):
    from django.apps import apps

    apps.set_installed_apps([])
    try:
        with pytest.raises(ImproperlyConfigured) as raised:
            runledger.get_engine()
    finally:
        apps.unset_installed_apps()
    message = str(raised.value)
    assert message.startswith("config.invalid: ") and '"runledger_sync.contrib.django" to INSTALLED_APPS' in message


def test_dashboard_default_hook_admits_staff_users_only(project):
    from types import SimpleNamespace

    from runledger_sync.contrib.django.urls import staff_only

    assert staff_only(SimpleNamespace(user=SimpleNamespace(is_staff=True)), "view")
    assert not staff_only(SimpleNamespace(user=SimpleNamespace(is_staff=False)), "replay")
    assert not staff_only(SimpleNamespace(), "view")  # no auth middleware


def test_dashboard_setting_is_checked(project):
    class Settings:
        RUNLEDGER = {"DASHBOARD": {"READONLY": False}}  # noqa: RUF012 - a settings stub

    with pytest.raises(ImproperlyConfigured, match="DASHBOARD"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"DASHBOARD": {"READ_ONLY": "no"}}
    with pytest.raises(ImproperlyConfigured, match="READ_ONLY"):
        read_settings(Settings)
    Settings.RUNLEDGER = {"DASHBOARD": {"READ_ONLY": False, "AUTHORIZE": "a.b:c"}}
    assert read_settings(Settings).dashboard.read_only is False


def test_dashboard_bulk_cancel_confirms_and_acts_under_djangos_csrf_protection(runledger):
    from django.test import Client

    engine = runledger.get_engine()
    jobs = [rl.enqueue(engine, JOB_TYPE, {"item": n}, meta={"tenant": "acme"}) for n in range(2)]
    client = Client(enforce_csrf_checks=True)
    confirm = client.get("/ops/jobs/bulk_cancel?meta=tenant%3Dacme", HTTP_X_OPERATOR="ada").content.decode()
    assert '<strong id="dry-run-count">2</strong>' in confirm
    drawn_at = re.search(r'name="drawn_at" value="([^"]+)"', confirm).group(1)
    form = {"meta": "tenant=acme", "reason": "offboarded", "drawn_at": drawn_at,
            "csrfmiddlewaretoken": django_csrf_token(confirm)}
    without_token = client.post("/ops/jobs/bulk_cancel", {**form, "csrfmiddlewaretoken": ""},
                                HTTP_X_OPERATOR="ada", HTTP_ORIGIN="http://testserver")
    assert without_token.status_code == 403 and rl.list_operations(engine) == []
    done = client.post("/ops/jobs/bulk_cancel", form, HTTP_X_OPERATOR="ada", HTTP_ORIGIN="http://testserver")
    [operation] = rl.list_operations(engine)
    assert done.status_code == 303 and done["Location"] == f"/ops/operations?done={operation.id}"
    assert (operation.action, operation.reason, operation.changed) == ("cancel", "offboarded", 2)
    assert {rl.get_job(engine, job.id).status for job in jobs} == {rl.JobStatus.CANCELED}
