"""The dashboard mounted in a Flask app by one line: ``Runledger(app, dashboard="/ops")``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import flask
import pytest

import runledger_sync as rl
from runledger_sync.contrib.flask import Runledger
from runledger_sync.web import allow_anyone
from tests.db.web.conftest import CSRF_FIELD, dead_lettered, page

#: What a browser's POST from the dashboard's own page names (the test client's base URL is http://localhost/).
SAME_ORIGIN = {"Origin": "http://localhost"}
#: The actions the hook saw, with the Flask request's header it decided on.
asked: list[tuple[str, Any]] = []


def header_decides(request, action: str) -> bool:
    # Runs inside the Flask request context: flask.request is the current request.
    asked.append((action, flask.request.headers.get("X-Operator")))
    return action == "view" or flask.request.headers.get("X-Operator") == "ada"


@pytest.fixture
def flask_app(db, fresh_database):
    app = flask.Flask("rl_dashboard_mount")
    app.secret_key = "flask-secret"
    app.config.update(RUNLEDGER_DATABASE_URL=fresh_database, RUNLEDGER_DASHBOARD_READ_ONLY=False,
                      RUNLEDGER_DASHBOARD_AUTHORIZE=header_decides)
    extension = Runledger(app, dashboard="/ops")

    @app.get("/")
    def home() -> str:
        return "the app's own page"

    yield app
    extension.engine.dispose()


def test_flask_mount_serves_the_dashboard_below_its_prefix(db, flask_app):
    job = dead_lettered(db)
    client = flask_app.test_client()
    assert client.get("/").get_data(as_text=True) == "the app's own page"
    overview = page(client, "/ops/")
    assert 'href="/ops/jobs"' in overview and 'href="/ops/static/style.css"' in overview
    assert 'id="job-status">DEAD_LETTERED<' in page(client, f"/ops/jobs/{job.id}")
    assert client.get("/ops/static/style.css").status_code == 200


def test_flask_mount_replays_through_the_hook_which_sees_the_flask_request(db, flask_app):
    job = dead_lettered(db)
    client = flask_app.test_client()
    html = client.get("/ops/dead-letters", headers={"X-Operator": "ada"}).get_data(as_text=True)
    token = CSRF_FIELD.search(html).group(1)
    refused = client.post("/ops/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": token},
                          headers={"X-Operator": "mallory", **SAME_ORIGIN})
    assert refused.status_code == 403 and rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED
    allowed = client.post("/ops/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": token},
                          headers={"X-Operator": "ada", **SAME_ORIGIN})
    assert allowed.status_code == 303 and allowed.headers["Location"] == "/ops/dead-letters?replayed=1"
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING
    assert ("replay", "mallory") in asked and ("replay", "ada") in asked


# -- secure by default, the Flask request in the hooks, CSRF bound to the Flask session ---------


def mounted(database_url: str, **config: Any) -> flask.Flask:
    app = flask.Flask("rl_dashboard_defaults")
    app.secret_key = "flask-secret"
    app.config.update(RUNLEDGER_DATABASE_URL=database_url, **config)
    Runledger(app, dashboard="/ops")
    return app


@pytest.fixture
def make_app() -> Iterator[Any]:
    apps: list[flask.Flask] = []

    def make(database_url: str, **config: Any) -> flask.Flask:
        apps.append(mounted(database_url, **config))
        return apps[-1]

    yield make
    for app in apps:
        with app.app_context():
            app.extensions["runledger"].engine.dispose()


def test_flask_mount_without_a_hook_serves_nobody_and_says_which_key_to_set(db, fresh_database, make_app):
    job = rl.enqueue(db, "web.email", {"secret_marker": "ssn-123-45"})
    client = make_app(fresh_database).test_client()
    for url in ("/ops/", f"/ops/jobs/{job.id}?payload=1", "/ops/dead-letters"):
        html = page(client, url, status=403)
        assert 'id="error-code">web.authorize_missing<' in html and "ssn-123-45" not in html
        assert "RUNLEDGER_DASHBOARD_AUTHORIZE" in html and "runledger_sync.web.allow_anyone" in html
    assert 'id="job-status">PENDING<' in page(make_app(fresh_database, RUNLEDGER_DASHBOARD_AUTHORIZE=allow_anyone)
                                               .test_client(), f"/ops/jobs/{job.id}")


def cookie_user(request, action: str):
    """The hook a Flask user writes first: the request it is given is Flask's, and the context is the request's."""
    assert request is flask.request._get_current_object()
    flask.session["seen"] = True
    return flask.g.user if action == "view" or flask.g.user == "ada" else False


def test_flask_hook_is_given_the_flask_request_inside_the_request_context(db, fresh_database, make_app):
    job = rl.enqueue(db, "web.email", {"n": 1})
    app = make_app(fresh_database, RUNLEDGER_DASHBOARD_READ_ONLY=False, RUNLEDGER_DASHBOARD_AUTHORIZE=cookie_user)

    @app.before_request
    def load_user() -> None:
        flask.g.user = flask.request.cookies.get("user") or False

    client = app.test_client()
    client.set_cookie("user", "ada")
    html = page(client, f"/ops/jobs/{job.id}")
    assert 'id="cancel-job"' in html
    token = CSRF_FIELD.search(html).group(1)
    response = client.post(f"/ops/jobs/{job.id}/cancel", data={"csrf_token": token}, headers={"Origin": "http://localhost"})
    assert response.status_code == 303 and rl.get_job(db, job.id).status is rl.JobStatus.CANCELED
    assert client.get_cookie("runledger_csrf") is None  # the value lives in Flask's session instead
    client.delete_cookie("user")
    assert "web.action_forbidden" in page(client, "/ops/", status=403)


def test_flask_forms_are_bound_to_the_flask_session(db, fresh_database, make_app):
    job = rl.enqueue(db, "web.email", {"n": 1})
    app = make_app(fresh_database, RUNLEDGER_DASHBOARD_READ_ONLY=False, RUNLEDGER_DASHBOARD_AUTHORIZE=allow_anyone)
    first, second = app.test_client(), app.test_client()
    token = CSRF_FIELD.search(page(first, f"/ops/jobs/{job.id}")).group(1)
    page(second, f"/ops/jobs/{job.id}")  # a session of its own
    refused = second.post(f"/ops/jobs/{job.id}/cancel", data={"csrf_token": token}, headers=SAME_ORIGIN)
    assert refused.status_code == 403 and "web.csrf_rejected" in refused.get_data(as_text=True)
    cross = first.post(f"/ops/jobs/{job.id}/cancel", data={"csrf_token": token},
                       headers={"Origin": "http://localhost:5001"})
    assert cross.status_code == 403 and "web.cross_origin_rejected" in cross.get_data(as_text=True)
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING
    assert first.post(f"/ops/jobs/{job.id}/cancel", data={"csrf_token": token}, headers=SAME_ORIGIN).status_code == 303


def test_flask_read_only_refusal_names_the_config_key(db, fresh_database, make_app):
    job = dead_lettered(db)
    client = make_app(fresh_database, RUNLEDGER_DASHBOARD_AUTHORIZE=allow_anyone).test_client()
    response = client.post("/ops/dead-letters/replay", data={"job_id": str(job.id)})
    html = response.get_data(as_text=True)
    assert response.status_code == 403 and 'id="error-code">web.read_only<' in html
    assert "RUNLEDGER_DASHBOARD_READ_ONLY" in html and "create_app" not in html


def test_flask_mount_on_an_unmigrated_database_is_a_503_naming_flask_runledger_migrate(empty_database, make_app):
    client = make_app(empty_database, RUNLEDGER_DASHBOARD_AUTHORIZE=allow_anyone).test_client()
    for url in ("/ops/", "/ops/jobs", "/ops/dead-letters"):
        response = client.get(url)
        html = response.get_data(as_text=True)
        assert response.status_code == 503, url
        assert 'id="error-code">db.schema_mismatch<' in html and "flask runledger migrate" in html
        assert response.headers["X-Frame-Options"] == "DENY"
