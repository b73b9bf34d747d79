"""The dashboard answers only to its own host names (DNS rebinding), and refuses a POST that names no origin.

The attack: a page on evil.example, whose DNS the attacker re-points at the
dashboard's address after it loaded, is same-origin with the dashboard as far as
the browser knows. Its script reads a page (and the form token on it) and posts
the form; every one of its requests carries ``Host: evil.example``.
"""

from __future__ import annotations

from typing import Any

import flask
import pytest
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.contrib.flask import Runledger
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import CSRF_FIELD, EMAIL, dashboard_process, page

EVIL = "evil.example"


def pending(db: Any) -> rl.JobRecord:
    return rl.enqueue(db, EMAIL, {"secret": "do-not-show"})


def rebinding_attack(client: Client, job: rl.JobRecord, prefix: str = "") -> list[Any]:
    """What the rebinding page does: read the job's page, then post its cancel form, all addressed to evil.example."""
    token = CSRF_FIELD.search(page(client, f"{prefix}/jobs/{job.id}"))  # a token read legitimately, from localhost
    assert token is not None
    base = f"http://{EVIL}"
    read = client.get(f"{prefix}/jobs/{job.id}", base_url=base)
    cancel = client.post(f"{prefix}/jobs/{job.id}/cancel", base_url=base, data={"csrf_token": token.group(1)},
                         headers={"Origin": base})
    return [read, cancel]


def assert_refused_with_no_data(response: Any, job: rl.JobRecord, code: str, status: int) -> None:
    html = response.get_data(as_text=True)
    assert response.status_code == status and f'id="error-code">{code}<' in html, html
    assert str(job.id) not in html and "do-not-show" not in html and 'name="csrf_token" value="' not in html


def test_create_app_with_allow_anyone_and_actions_refuses_a_rebound_host(db):
    job = pending(db)
    client = Client(create_app(db, read_only=False, authorize=allow_anyone))
    for response in rebinding_attack(client, job):
        assert_refused_with_no_data(response, job, "web.host_not_allowed", 400)
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:5000", "[::1]:8080", "LOCALHOST"])
def test_create_app_answers_to_the_loopback_names_on_any_port(db, host):
    client = Client(create_app(db, authorize=allow_anyone))
    assert client.get("/", base_url=f"http://{host}").status_code == 200


def test_create_app_answers_to_its_allowed_hosts_and_loopback_and_no_other(db):
    client = Client(create_app(db, authorize=allow_anyone, allowed_hosts=["Ops.Example.com", "10.0.0.5:8080"]))
    statuses = {host: client.get("/", base_url=f"http://{host}").status_code
                for host in ("ops.example.com:8443", "10.0.0.5", "localhost", EVIL, "ops.example.com.evil.example")}
    assert statuses == {"ops.example.com:8443": 200, "10.0.0.5": 200, "localhost": 200, EVIL: 400,
                        "ops.example.com.evil.example": 400}


def test_create_app_with_the_any_host_entry_answers_to_every_host(db):
    client = Client(create_app(db, authorize=allow_anyone, allowed_hosts=["*"]))
    assert client.get("/", base_url=f"http://{EVIL}").status_code == 200


def test_the_stylesheet_is_refused_to_a_rebound_host_too(db):
    client = Client(create_app(db, authorize=allow_anyone))
    assert client.get("/static/style.css", base_url=f"http://{EVIL}").status_code == 400


@pytest.mark.parametrize("allowed_hosts", ["ops.example.com", ["http://ops.example.com/"], [""], ["a b"], [None],
                                           ["ops.example.com:port"], ["user@ops.example.com"]])
def test_create_app_refuses_allowed_hosts_that_are_not_host_names(db, allowed_hosts):
    with pytest.raises(rl.ConfigError) as refused:
        create_app(db, authorize=allow_anyone, allowed_hosts=allowed_hosts)
    assert refused.value.code == "config.invalid" and "allowed_hosts" in str(refused.value)


@pytest.mark.parametrize("headers,status,code", [
    ({}, 403, "web.origin_missing"),
    ({"Sec-Fetch-Site": "same-origin"}, 303, None),
    ({"Origin": "http://localhost"}, 303, None),
])
def test_a_post_naming_neither_origin_nor_fetch_site_is_refused(db, headers, status, code):
    job = pending(db)
    client = Client(create_app(db, read_only=False, authorize=allow_anyone))
    token = CSRF_FIELD.search(page(client, f"/jobs/{job.id}")).group(1)
    response = client.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token}, headers=headers)
    assert response.status_code == status, response.get_data(as_text=True)
    if code is not None:
        assert f'id="error-code">{code}<' in response.get_data(as_text=True)
    expected = rl.JobStatus.PENDING if code else rl.JobStatus.CANCELED
    assert rl.get_job(db, job.id).status is expected


@pytest.fixture
def make_flask(db, fresh_database):
    made = []

    def make(**config: Any) -> flask.Flask:
        app = flask.Flask("rl_dashboard_hosts")
        app.secret_key = "flask-secret"
        app.config.update(RUNLEDGER_DATABASE_URL=fresh_database, RUNLEDGER_DASHBOARD_READ_ONLY=False,
                          RUNLEDGER_DASHBOARD_AUTHORIZE=allow_anyone, **config)
        made.append(Runledger(app, dashboard="/ops"))
        return app

    yield make
    for extension in made:
        extension.engine.dispose()


def test_flask_mount_with_allow_anyone_refuses_a_rebound_host(db, make_flask):
    job = pending(db)
    client = make_flask().test_client()
    for response in rebinding_attack(client, job, prefix="/ops"):
        assert_refused_with_no_data(response, job, "web.host_not_allowed", 400)
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING


def test_flask_mount_answers_to_its_allowed_hosts_and_server_name(db, make_flask):
    client = make_flask(RUNLEDGER_DASHBOARD_ALLOWED_HOSTS=["ops.example.com"]).test_client()
    statuses = {host: client.get("/ops/", base_url=f"http://{host}").status_code
                for host in ("ops.example.com", "localhost:5000", EVIL)}
    assert statuses == {"ops.example.com": 200, "localhost:5000": 200, EVIL: 400}
    named = make_flask(SERVER_NAME="jobs.example.com:5000").test_client()
    assert named.get("/ops/", base_url="http://jobs.example.com:5000").status_code == 200


def test_flask_mount_refuses_an_allowed_hosts_setting_that_is_not_a_list(make_flask):
    with pytest.raises(rl.ConfigError) as refused:
        make_flask(RUNLEDGER_DASHBOARD_ALLOWED_HOSTS="ops.example.com")
    assert refused.value.code == "config.invalid"


def test_flask_mount_refuses_a_post_naming_no_origin(db, make_flask):
    job = pending(db)
    client = make_flask().test_client()
    token = CSRF_FIELD.search(page(client, f"/ops/jobs/{job.id}")).group(1)
    response = client.post(f"/ops/jobs/{job.id}/cancel", data={"csrf_token": token})
    assert response.status_code == 403 and 'id="error-code">web.origin_missing<' in response.get_data(as_text=True)
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING


def test_dashboard_command_answers_to_each_allowed_host_and_no_other(fresh_database):
    from tests.db.web.test_web_http import get_with_host

    with dashboard_process(fresh_database, "--allowed-host", "ops.example.com",
                           "--allowed-host", "10.1.2.3") as base:
        statuses = {host: get_with_host(base, host)[0] for host in ("ops.example.com", "10.1.2.3", "localhost", EVIL)}
    assert statuses == {"ops.example.com": 200, "10.1.2.3": 200, "localhost": 200, EVIL: 400}
