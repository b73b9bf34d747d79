"""The dashboard mounted in a Flask app by one line: ``Runledger(app, dashboard="/ops")``."""

from __future__ import annotations

from typing import Any

import flask
import pytest

import runledger_sync as rl
from runledger_sync.contrib.flask import Runledger
from tests.db.web.conftest import CSRF_FIELD, dead_lettered, page

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
                          headers={"X-Operator": "mallory"})
    assert refused.status_code == 403 and rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED
    allowed = client.post("/ops/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": token},
                          headers={"X-Operator": "ada"})
    assert allowed.status_code == 303 and allowed.headers["Location"] == "/ops/dead-letters?replayed=1"
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING
    assert ("replay", "mallory") in asked and ("replay", "ada") in asked
