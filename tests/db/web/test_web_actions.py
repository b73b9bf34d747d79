"""The dashboard's actions and refusals, checked in the database: replay, cancel, retry, schedules, read-only, CSRF."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import (
    Browser,
    CSRF_FIELD,
    EMAIL,
    HOSTILE,
    REPORT,
    allow_all,
    dead_lettered,
    finish,
    page,
    post_form,
    succeeded,
)
from tests.support import define, scalar


def status_of(db, job: rl.JobRecord) -> tuple[str, int]:
    found = rl.get_job(db, job.id)
    return found.status.value, found.run_number


def test_replay_one_dead_letter_requeues_it_as_a_new_run(db, admin):
    job = dead_lettered(db)
    response = post_form(admin, "/dead-letters", "/dead-letters/replay", {"job_id": str(job.id)})
    assert response.status_code == 303 and response.headers["Location"] == "/dead-letters?replayed=1"
    assert status_of(db, job) == ("PENDING", 2)
    assert rl.get_job(db, job.id).status_reason == "DEAD_LETTER_REPLAY"
    assert "Requeued 1 job(s)." in page(admin, "/dead-letters?replayed=1")


def test_bulk_replay_requeues_the_chosen_dead_letters_only(db, admin):
    first, second, left = dead_lettered(db), dead_lettered(db), dead_lettered(db)
    done = succeeded(db)
    chosen = [str(first.id), str(second.id), str(done.id)]
    response = post_form(admin, "/dead-letters", "/dead-letters/replay", {"job_id": chosen})
    assert response.headers["Location"] == "/dead-letters?replayed=2"
    assert [status_of(db, j) for j in (first, second, left, done)] == [
        ("PENDING", 2), ("PENDING", 2), ("DEAD_LETTERED", 1), ("SUCCEEDED", 1)]


def test_replay_with_nothing_chosen_is_a_clear_error(db, admin):
    dead_lettered(db)
    response = post_form(admin, "/dead-letters", "/dead-letters/replay", {})
    assert response.status_code == 400 and "job.invalid_argument" in response.get_data(as_text=True)


def test_cancel_and_retry_from_the_job_page(db, admin):
    pending = rl.enqueue(db, EMAIL, {"n": 1})
    response = post_form(admin, f"/jobs/{pending.id}", f"/jobs/{pending.id}/cancel", {})
    assert response.headers["Location"] == f"/jobs/{pending.id}?done=canceled"
    assert status_of(db, pending) == ("CANCELED", 1)
    assert 'id="done">The job was canceled.<' in page(admin, f"/jobs/{pending.id}?done=canceled")

    response = post_form(admin, f"/jobs/{pending.id}", f"/jobs/{pending.id}/retry", {})
    assert response.headers["Location"] == f"/jobs/{pending.id}?done=retried"
    assert status_of(db, pending) == ("PENDING", 2)


def test_run_again_from_a_page_that_went_stale_is_a_conflict_and_runs_nothing(db, admin):
    job = succeeded(db)
    shown = page(admin, f"/jobs/{job.id}")
    assert 'name="seen_status" value="SUCCEEDED"' in shown and 'name="seen_run" value="1"' in shown
    seen = {"seen_status": "SUCCEEDED", "seen_run": "1"}
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/retry", seen)
    assert response.headers["Location"] == f"/jobs/{job.id}?done=retried"
    rl.cancel_job(db, job.id)  # run 2 ended again before the same stale page was submitted a second time
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/retry", seen)
    assert response.status_code == 409 and "job.requeue_expectation_failed" in response.get_data(as_text=True)
    assert status_of(db, job) == ("CANCELED", 2)
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/retry", {"seen_run": "two"})
    assert response.status_code == 400 and "job.invalid_argument" in response.get_data(as_text=True)
    assert status_of(db, job) == ("CANCELED", 2)


def test_cancel_of_a_finished_job_is_a_conflict_and_changes_nothing(db, admin):
    done = succeeded(db)
    response = post_form(admin, f"/jobs/{done.id}", f"/jobs/{done.id}/cancel", {})
    assert response.status_code == 409 and "job.invalid_state_transition" in response.get_data(as_text=True)
    assert status_of(db, done) == ("SUCCEEDED", 1)


def test_schedules_pause_resume_and_trigger(db, admin):
    rl.upsert_schedule(db, "nightly", cron_expr="0 0 3 * * *", job_type=REPORT)
    post_form(admin, "/schedules", "/schedules/pause", {"name": "nightly"})
    assert rl.get_schedule(db, "nightly").is_active is False
    post_form(admin, "/schedules", "/schedules/resume", {"name": "nightly"})
    assert rl.get_schedule(db, "nightly").is_active is True
    response = post_form(admin, "/schedules", "/schedules/trigger", {"name": "nightly"})
    assert response.headers["Location"] == "/schedules?done=triggered&name=nightly"
    assert rl.count_jobs(db, job_type=REPORT) == 1


def test_an_unknown_schedule_is_not_found(db, admin):
    rl.upsert_schedule(db, "known", cron_expr="@daily", job_type=REPORT)
    response = post_form(admin, "/schedules", "/schedules/pause", {"name": "nope"})
    assert response.status_code == 404 and "schedule.not_found" in response.get_data(as_text=True)


# -- refusals ------------------------------------------------------------------------------


def test_read_only_mode_refuses_every_post_and_draws_no_buttons(db):
    job = dead_lettered(db)
    read_only = Browser(create_app(db, authorize=allow_all))
    html = page(read_only, "/dead-letters")
    assert "Replay" not in html and "csrf_token" not in html
    assert "Run again" not in page(read_only, f"/jobs/{job.id}")
    response = read_only.post("/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": "0" * 64})
    assert response.status_code == 403 and 'id="error-code">web.read_only<' in response.get_data(as_text=True)
    assert status_of(db, job) == ("DEAD_LETTERED", 1)


def test_a_post_without_the_csrf_token_is_refused(db, admin):
    job = dead_lettered(db)
    page(admin, "/dead-letters")  # the browser holds its cookie, but the form below lacks the token
    response = admin.post("/dead-letters/replay", data={"job_id": str(job.id)})
    assert response.status_code == 403 and 'id="error-code">web.csrf_rejected<' in response.get_data(as_text=True)
    assert status_of(db, job) == ("DEAD_LETTERED", 1)


def test_a_token_from_another_browser_is_refused(db):
    job = dead_lettered(db)
    app = create_app(db, read_only=False, authorize=allow_all)
    victim, attacker = Browser(app), Browser(app)
    attackers_token = post_form_token(attacker)
    page(victim, "/dead-letters")
    response = victim.post("/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": attackers_token})
    assert response.status_code == 403 and "web.csrf_rejected" in response.get_data(as_text=True)
    assert status_of(db, job) == ("DEAD_LETTERED", 1)


def post_form_token(client: Client) -> str:
    """The token a dead-letters page draws for this client's browser (a dead letter must exist)."""
    return CSRF_FIELD.search(page(client, "/dead-letters")).group(1)


def test_a_token_signed_by_another_apps_secret_is_refused(db):
    job = dead_lettered(db)
    first = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"first secret"))
    token = post_form_token(first)
    # The same browser (cookie) against an app with another secret: the signature does not match.
    second_app = create_app(db, read_only=False, authorize=allow_all, secret=b"second secret")
    cookie = first.get_cookie("runledger_csrf")
    second = Browser(second_app)
    second.set_cookie("runledger_csrf", cookie.value)
    response = second.post("/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": token})
    assert response.status_code == 403 and "web.csrf_rejected" in response.get_data(as_text=True)
    assert status_of(db, job) == ("DEAD_LETTERED", 1)


def test_the_authorize_hook_is_asked_with_the_action_and_can_refuse(db):
    job = dead_lettered(db)
    asked: list[str] = []

    def only_views(request, action):
        asked.append(action)
        return action == "view"

    refusing = Browser(create_app(db, read_only=False, authorize=only_views, secret=b"shared"))
    assert "Replay" not in page(refusing, "/dead-letters")
    twin = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"shared"))
    token = post_form_token(twin)
    refusing.set_cookie("runledger_csrf", twin.get_cookie("runledger_csrf").value)
    response = refusing.post("/dead-letters/replay", data={"job_id": str(job.id), "csrf_token": token})
    assert response.status_code == 403 and 'id="error-code">web.action_forbidden<' in response.get_data(as_text=True)
    assert "replay" in asked
    assert status_of(db, job) == ("DEAD_LETTERED", 1)


def test_without_an_authorize_hook_nothing_is_served_and_the_page_says_how_to_pass_one(db):
    job = rl.enqueue(db, EMAIL, {"secret_marker": "ssn-123-45"})
    dead_lettered(db)
    for read_only in (True, False):
        unguarded = Browser(create_app(db, read_only=read_only, secret=b"shared"))
        for url in ("/", "/jobs", f"/jobs/{job.id}", f"/jobs/{job.id}?payload=1", "/dead-letters", "/schedules",
                    "/workflows"):
            html = page(unguarded, url, status=403)
            assert 'id="error-code">web.authorize_missing<' in html and "ssn-123-45" not in html, url
            assert "create_app(engine, authorize=hook)" in html and "runledger_sync.web.allow_anyone" in html
        assert unguarded.get("/static/style.css").status_code == 200
    # A valid token, drawn by a twin app that lets anyone in, for the same browser.
    twin = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"shared"))
    token = post_form_token(twin)
    unguarded.set_cookie("runledger_csrf", twin.get_cookie("runledger_csrf").value)
    response = unguarded.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token})
    assert response.status_code == 403 and "web.authorize_missing" in response.get_data(as_text=True)
    assert status_of(db, job) == ("PENDING", 1)


def test_allow_anyone_is_the_explicit_choice_to_serve_everyone(db):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    readers = Browser(create_app(db, authorize=allow_anyone))
    assert 'id="job-status">PENDING<' in page(readers, f"/jobs/{job.id}")
    assert "Cancel" not in page(readers, f"/jobs/{job.id}")  # read-only unless asked otherwise
    operators = Browser(create_app(db, read_only=False, authorize=allow_anyone))
    response = post_form(operators, f"/jobs/{job.id}", f"/jobs/{job.id}/cancel", {})
    assert response.status_code == 303 and status_of(db, job) == ("CANCELED", 1)


def test_a_hook_refusing_views_hides_every_page(db):
    hidden = Browser(create_app(db, authorize=lambda request, action: False))
    for url in ("/", "/jobs", "/dead-letters", "/schedules", "/workflows"):
        assert "web.action_forbidden" in page(hidden, url, status=403)


def test_a_scoped_dashboard_cannot_act_on_another_organizations_job(db):
    theirs = dead_lettered(db, organization_id="org-b")
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a"))
    response = post_form(scoped, "/dead-letters", "/dead-letters/replay", {"job_id": str(theirs.id)})
    assert response.headers["Location"] == "/dead-letters?replayed=0"
    response = post_form(scoped, "/dead-letters", f"/jobs/{theirs.id}/retry", {})
    assert response.status_code == 404
    assert status_of(db, theirs) == ("DEAD_LETTERED", 1)


# -- escaping --------------------------------------------------------------------------------


@pytest.fixture
def hostile(db):
    """A job, dead letter and schedule whose every user-controlled field is markup."""
    define(db, HOSTILE, max_attempts=1)
    job = rl.enqueue(db, HOSTILE, {"note": HOSTILE}, idempotency_key=HOSTILE, organization_id=HOSTILE, priority=10**6)
    finish(db, job, fail=True, message=HOSTILE)
    rl.upsert_schedule(db, HOSTILE, cron_expr="@daily", job_type=HOSTILE, organization_id=HOSTILE)
    return job


def test_every_user_controlled_field_is_escaped(db, admin, hostile):
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE job_type = :t", t=HOSTILE) == 1
    urls = ["/", "/jobs", f"/jobs?q={HOSTILE}", f"/jobs/{hostile.id}", f"/jobs/{hostile.id}?payload=1",
            "/dead-letters", "/schedules", f"/schedules?done=paused&name={HOSTILE}"]
    for url in urls:
        html = page(admin, url)
        assert "<script>alert" not in html and "<img src=x" not in html, url
    job_page = page(admin, f"/jobs/{hostile.id}?payload=1")
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in job_page.split('id="last-error"', 1)[1]
    assert "&lt;img src=x onerror=alert(1)&gt;" in job_page.split('id="payload"', 1)[1]
    assert "&lt;script&gt;" in page(admin, "/schedules").split('id="schedules"', 1)[1]


def test_each_action_and_refusal_is_logged_without_the_payload(db, admin, caplog):
    job = dead_lettered(db, payload={"secret": "do-not-log-me"})
    caplog.set_level("INFO", logger="runledger_sync.web")
    post_form(admin, "/dead-letters", "/dead-letters/replay", {"job_id": str(job.id)})
    post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/retry", {})  # PENDING now: refused
    records = [(r.getMessage(), r.action, getattr(r, "error_code", None)) for r in caplog.records if hasattr(r, "action")]
    assert records == [("dashboard action", "replay", None),
                       ("dashboard action refused", "retry", "job.invalid_state_transition")]
    assert "do-not-log-me" not in caplog.text


def test_the_csrf_cookie_is_http_only_strict_and_secure_over_https(db, client):
    plain = client.get("/").headers["Set-Cookie"]
    assert "HttpOnly" in plain and "SameSite=Strict" in plain and "Secure" not in plain
    assert "; Secure" in Browser(create_app(db, authorize=allow_all)).get("/", base_url="https://localhost/").headers["Set-Cookie"]
