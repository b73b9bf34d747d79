"""CSRF on the standalone dashboard: origin checks, and form tokens bound to the browser's session and the user.

The attack these guard against: a user allowed in organization B reads the form
token of a cookie value he chose, a page on another port of the same host (the same
*site*, so SameSite cookies travel) plants that cookie in an admin's browser, then
auto-posts a cancel of an organization A job from there.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import Browser, CSRF_FIELD, EMAIL, allow_all, page

#: The origin werkzeug's test client addresses (base_url http://localhost/).
OWN_ORIGIN = "http://localhost"
USERS = {"ada-session": "ada", "bob-session": "bob"}


def user_from_cookie(request: Any, action: str) -> Optional[str]:
    """A hook as an app with its own login writes it: the user is read from the app's session cookie."""
    return USERS.get(request.cookie("app_session") or "")


@pytest.fixture
def app(db) -> Any:
    return create_app(db, read_only=False, authorize=user_from_cookie, secret=b"shared")


def browser(app: Any, session: str) -> Client:
    client = Browser(app)
    client.set_cookie("app_session", session)
    return client


def token_and_cookie(client: Client, job: rl.JobRecord) -> tuple[str, str]:
    token = CSRF_FIELD.search(page(client, f"/jobs/{job.id}")).group(1)
    return token, client.get_cookie("runledger_csrf").value


def status(db: Any, job: rl.JobRecord) -> str:
    return rl.get_job(db, job.id).status.value


def test_a_token_read_by_one_user_is_refused_for_another_even_with_the_same_cookie(db, app):
    job = rl.enqueue(db, EMAIL, {"n": 1}, organization_id="org-a")
    bob = browser(app, "bob-session")
    bobs_token, bobs_cookie = token_and_cookie(bob, job)
    ada = browser(app, "ada-session")
    ada.set_cookie("runledger_csrf", bobs_cookie)  # planted from another port of the same host
    response = ada.post(f"/jobs/{job.id}/cancel", data={"csrf_token": bobs_token})
    assert response.status_code == 403 and 'id="error-code">web.csrf_rejected<' in response.get_data(as_text=True)
    assert status(db, job) == "PENDING"
    # The same cookie and token in bob's own browser: the token was made for him, and it works.
    assert bob.post(f"/jobs/{job.id}/cancel", data={"csrf_token": bobs_token}).status_code == 303
    assert status(db, job) == "CANCELED"


def test_the_planted_cookie_attack_from_another_port_is_refused(db, app):
    job = rl.enqueue(db, EMAIL, {"n": 1}, organization_id="org-a")
    bobs_token, bobs_cookie = token_and_cookie(browser(app, "bob-session"), job)
    ada = browser(app, "ada-session")
    ada.set_cookie("runledger_csrf", bobs_cookie)
    response = ada.post(f"/jobs/{job.id}/cancel", data={"csrf_token": bobs_token},
                        headers={"Origin": "http://localhost:8081", "Sec-Fetch-Site": "same-site"})
    assert response.status_code == 403
    assert 'id="error-code">web.cross_origin_rejected<' in response.get_data(as_text=True)
    assert status(db, job) == "PENDING"


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost:8081"},                  # another port of the same host
    {"Origin": "https://localhost"},                      # another scheme
    {"Origin": "http://evil.example"},
    {"Origin": "null"},                                   # a sandboxed or privacy-redirected page
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site", "Origin": OWN_ORIGIN},
], ids=["other-port", "other-scheme", "other-host", "null", "same-site", "fetch-site-wins"])
def test_a_cross_origin_post_is_refused_with_its_code_even_with_a_valid_token(db, app, headers):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    ada = browser(app, "ada-session")
    token, _ = token_and_cookie(ada, job)
    response = ada.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token}, headers=headers)
    assert response.status_code == 403
    html = response.get_data(as_text=True)
    assert 'id="error-code">web.cross_origin_rejected<' in html and response.headers["X-Frame-Options"] == "DENY"
    assert status(db, job) == "PENDING"


@pytest.mark.parametrize("headers", [
    {"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "same-origin"},
    {"Origin": "http://LOCALHOST:80"},                    # the same origin, spelt out
    {"Sec-Fetch-Site": "same-origin"},                    # a browser that strips Origin
], ids=["browser", "default-port", "fetch-site-only"])
def test_a_same_origin_post_by_the_right_user_works(db, app, headers):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    ada = browser(app, "ada-session")
    token, _ = token_and_cookie(ada, job)
    response = ada.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token}, headers=headers)
    assert response.status_code == 303, response.get_data(as_text=True)
    assert status(db, job) == "CANCELED"


def test_the_origin_is_compared_with_the_host_the_request_was_addressed_to(db):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    admin = Browser(create_app(db, read_only=False, authorize=allow_all, allowed_hosts=["ops.example"]))
    base = "http://ops.example:8443/"
    token = CSRF_FIELD.search(admin.get(f"/jobs/{job.id}", base_url=base).get_data(as_text=True)).group(1)
    elsewhere = admin.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token}, base_url=base,
                           headers={"Origin": "http://ops.example"})
    assert elsewhere.status_code == 403 and status(db, job) == "PENDING"
    here = admin.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token}, base_url=base,
                      headers={"Origin": "http://ops.example:8443"})
    assert here.status_code == 303 and status(db, job) == "CANCELED"
