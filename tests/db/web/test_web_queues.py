"""The Queues page, its pause, resume and limit actions with their refusals, and why a job waits on its page."""

from __future__ import annotations

import re
from typing import Any

import pytest

import runledger_sync as rl
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.driver import record_worker
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import Browser, CSRF_FIELD, EMAIL, HOSTILE, TOP, allow_all, page, post_form
from tests.support import define

MAIL = "web.mail"


@pytest.fixture
def mail(db) -> str:
    """A queue ``mail`` with every kind of limit, and a job type that joins it."""
    rl.configure_queue(db, "mail", global_limit=2, key_limit=1, rate_limit=rl.RateLimit(20, per_seconds=60))
    define(db, MAIL, queue="mail", max_attempts=3)
    return "mail"


def row_of(html: str, queue: str) -> str:
    """The table row of one queue on the Queues page."""
    found = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', html.split('id="queues"', 1)[1], re.S)
    assert found, f"no row for {queue}"
    return found.group(1)


def cells(row: str) -> list[str]:
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def paused(db: Any, name: str = "mail") -> bool:
    return rl.get_queue(db, name).paused


def test_queues_page_shows_each_queues_settings_and_what_waits_in_it(db, client, mail):
    rl.enqueue(db, EMAIL, {"n": 1})
    first = rl.enqueue(db, MAIL, {"n": 1}, concurrency_key="customer:1")
    rl.enqueue(db, MAIL, {"n": 2}, concurrency_key="customer:1")  # held behind the first
    rl.enqueue(db, MAIL, {"n": 3}, delay_seconds=3600)
    running = rl.enqueue(db, MAIL, {"n": 4}, priority=TOP)
    assert [job.id for job in claim_jobs(db, worker_id="w", lease_ttl_seconds=60, limit=1, job_types=[MAIL])] == [running.id]
    html = page(client, "/queues")
    # queue, state, global, key, rate, ready, held, scheduled, leased, rate used, actions
    assert cells(row_of(html, "mail")) == ["mail", "active", "2", "1", "20 per 60 s", "1", "1", "1", "1", "1 of 20", ""]
    assert cells(row_of(html, "default")) == ["default", "active", "none", "1", "none", "1", "0", "0", "0", "-", ""]
    assert rl.get_job(db, first.id).status is rl.JobStatus.PENDING
    assert 'href="/queues?queue=mail"' in html


def test_pause_and_resume_from_the_queues_page_change_the_queue_row(db, admin, mail):
    assert 'class="pause-queue"' in row_of(page(admin, "/queues"), "mail")
    response = post_form(admin, "/queues", "/queues/pause_queue", {"name": "mail"})
    assert response.status_code == 303 and response.headers["Location"] == "/queues?done=paused&name=mail"
    assert paused(db) and not paused(db, "default")
    html = page(admin, "/queues?done=paused&name=mail")
    assert 'id="done">Queue mail paused.<' in html
    row = row_of(html, "mail")
    assert cells(row)[1].startswith("paused since ") and 'class="resume-queue"' in row

    response = post_form(admin, "/queues", "/queues/resume_queue", {"name": "mail"})
    assert response.headers["Location"] == "/queues?done=resumed&name=mail"
    assert not paused(db)
    assert cells(row_of(page(admin, "/queues"), "mail"))[1] == "active"


def test_an_unknown_queue_is_a_coded_not_found_page_and_a_missing_name_a_coded_400(db, admin, mail):
    for action in ("pause_queue", "resume_queue", "configure_queue"):
        response = post_form(admin, "/queues", f"/queues/{action}", {"name": "nope", "global_limit": "3"})
        assert response.status_code == 404, action
        assert 'id="error-code">queue.not_found<' in response.get_data(as_text=True)
    assert [queue.name for queue in rl.list_queues(db)] == ["default", "mail"]  # configure created nothing
    assert 'id="error-code">queue.not_found<' in page(admin, "/queues?queue=nope", status=404)
    assert 'id="error-code">queue.invalid_name<' in page(admin, "/queues?queue=" + "q" * 200, status=400)
    response = post_form(admin, "/queues", "/queues/pause_queue", {})
    assert response.status_code == 400 and 'id="error-code">queue.invalid_name<' in response.get_data(as_text=True)


def test_the_limits_form_changes_every_limit_and_a_blank_field_removes_one(db, admin, mail):
    html = page(admin, "/queues?queue=mail")
    assert 'id="chosen">Queue mail<' in html and 'name="global_limit"' in html and 'value="2"' in html
    response = post_form(admin, "/queues?queue=mail", "/queues/configure_queue", {
        "name": "mail", "global_limit": "4", "key_limit": "", "rate_limit.count": "10",
        "rate_limit.per_seconds": "0.5", "rate_limit.per_key": "1"})
    assert response.status_code == 303 and response.headers["Location"] == "/queues?done=changed&name=mail"
    queue = rl.get_queue(db, "mail")
    assert (queue.global_limit, queue.key_limit, queue.rate_limit) == (4, None, rl.RateLimit(10, 0.5, per_key=True))
    post_form(admin, "/queues?queue=mail", "/queues/configure_queue", {"name": "mail", "key_limit": "3"})
    queue = rl.get_queue(db, "mail")
    assert (queue.global_limit, queue.key_limit, queue.rate_limit) == (None, 3, None)


@pytest.mark.parametrize("form, field", [
    ({"global_limit": "0"}, "global_limit"),
    ({"global_limit": "-3"}, "global_limit"),
    ({"key_limit": "two"}, "key_limit"),
    ({"key_limit": "9" * 4301}, "key_limit"),
    ({"global_limit": "2000000"}, "global_limit"),
    ({"rate_limit.count": "0", "rate_limit.per_seconds": "1"}, "rate_limit.count"),
    ({"rate_limit.count": "5"}, "rate_limit.per_seconds"),
    ({"rate_limit.count": "5", "rate_limit.per_seconds": "0"}, "rate_limit.per_seconds"),
    ({"rate_limit.count": "5", "rate_limit.per_seconds": "1e9"}, "rate_limit.per_seconds"),
], ids=["zero", "negative", "words", "huge", "over-range", "rate-zero", "rate-no-period", "period-zero", "period-exp"])
def test_a_bad_limit_is_a_coded_400_naming_the_field_and_changes_nothing(db, admin, mail, form, field):
    before = rl.get_queue(db, "mail")
    response = post_form(admin, "/queues?queue=mail", "/queues/configure_queue", {"name": "mail", **form})
    html = response.get_data(as_text=True)
    assert response.status_code == 400 and 'id="error-code">queue.invalid_setting<' in html
    assert f"{field} must be" in html
    assert rl.get_queue(db, "mail") == before


# -- refusals ------------------------------------------------------------------------------


def test_a_read_only_dashboard_draws_no_queue_buttons_and_refuses_the_actions(db, mail):
    read_only = Browser(create_app(db, authorize=allow_all))
    html = page(read_only, "/queues?queue=mail")
    assert "pause-queue" not in html and "csrf_token" not in html and 'id="configure"' not in html
    for action in ("pause_queue", "configure_queue"):
        response = read_only.post(f"/queues/{action}", data={"name": "mail", "global_limit": "9", "csrf_token": "0" * 64})
        assert response.status_code == 403 and 'id="error-code">web.read_only<' in response.get_data(as_text=True)
    assert not paused(db) and rl.get_queue(db, "mail").global_limit == 2


def test_a_queue_action_without_the_csrf_token_or_from_another_origin_is_refused(db, admin, mail):
    token = CSRF_FIELD.search(page(admin, "/queues")).group(1)
    response = admin.post("/queues/pause_queue", data={"name": "mail"})
    assert response.status_code == 403 and 'id="error-code">web.csrf_rejected<' in response.get_data(as_text=True)
    response = admin.post("/queues/pause_queue", data={"name": "mail", "csrf_token": token},
                          headers={"Origin": "http://localhost:8081"})
    assert response.status_code == 403 and 'id="error-code">web.cross_origin_rejected<' in response.get_data(as_text=True)
    assert not paused(db)
    assert admin.post("/queues/pause_queue", data={"name": "mail", "csrf_token": token},
                      headers={"Origin": "http://localhost"}).status_code == 303
    assert paused(db)


def test_the_hook_is_asked_for_the_queue_actions_by_name_and_can_refuse_them(db, mail):
    asked: list[str] = []

    def schedules_only(request: Any, action: str) -> bool:
        asked.append(action)
        return action in ("view", "pause", "resume")  # a schedule operator: not a queue operator

    refusing = Browser(create_app(db, read_only=False, authorize=schedules_only, secret=b"shared"))
    html = page(refusing, "/queues?queue=mail")
    assert "pause-queue" not in html and 'id="configure"' not in html
    twin = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"shared"))
    token = CSRF_FIELD.search(page(twin, "/queues")).group(1)
    refusing.set_cookie("runledger_csrf", twin.get_cookie("runledger_csrf").value)
    for action in ("pause_queue", "configure_queue"):
        response = refusing.post(f"/queues/{action}", data={"name": "mail", "global_limit": "9", "csrf_token": token})
        assert response.status_code == 403 and 'id="error-code">web.action_forbidden<' in response.get_data(as_text=True)
    assert {"pause_queue", "configure_queue"} <= set(asked)
    assert not paused(db) and rl.get_queue(db, "mail").global_limit == 2


def test_without_an_authorize_hook_the_queues_page_is_not_served(db, mail):
    assert 'id="error-code">web.authorize_missing<' in page(Browser(create_app(db)), "/queues", status=403)


def test_a_scoped_dashboard_shows_queue_settings_without_counts_and_cannot_change_a_queue(db, mail):
    rl.enqueue(db, MAIL, {"n": 1}, organization_id="org-b")
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a"))
    html = page(scoped, "/queues")
    assert cells(row_of(html, "mail")) == ["mail", "active", "2", "1", "20 per 60 s", ""]
    assert "Held by a key" not in html and "pause-queue" not in html
    assert "Ready" not in page(scoped, "/").split('id="overview-queues"', 1)[1].split("</table>", 1)[0]
    twin = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"s"))
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a", secret=b"s"))
    token = CSRF_FIELD.search(page(twin, "/queues")).group(1)
    scoped.set_cookie("runledger_csrf", twin.get_cookie("runledger_csrf").value)
    response = scoped.post("/queues/pause_queue", data={"name": "mail", "csrf_token": token})
    assert response.status_code == 403 and 'id="error-code">web.action_forbidden<' in response.get_data(as_text=True)
    assert not paused(db)


# -- the job page and the overview -----------------------------------------------------------


def test_the_job_page_says_a_pending_job_waits_for_its_paused_queue(db, client, mail):
    job = rl.enqueue(db, MAIL, {"n": 1}, concurrency_key="customer:7")
    rl.pause_queue(db, "mail")
    html = page(client, f"/jobs/{job.id}")
    assert 'id="wait-reason">queue_paused<' in html and "queue &#39;mail&#39; is paused since" in html
    assert 'id="job-queue"><a href="/queues?queue=mail">mail</a>' in html
    assert 'id="concurrency-key">customer:7<' in html


def test_the_job_page_links_the_job_that_holds_a_busy_key(db, client, mail):
    holder = rl.enqueue(db, MAIL, {"n": 1}, concurrency_key="customer:7")
    held = rl.enqueue(db, MAIL, {"n": 2}, concurrency_key="customer:7")
    html = page(client, f"/jobs/{held.id}")
    assert 'id="wait-reason">key_busy<' in html
    assert f'id="blocking-job" href="/jobs/{holder.id}"' in html
    # The holder itself is next in line: no worker serves it here.
    assert 'id="wait-reason">no_worker<' in page(client, f"/jobs/{holder.id}")


def test_a_scoped_job_page_does_not_name_another_organizations_blocking_job(db, mail):
    theirs = rl.enqueue(db, MAIL, {"n": 1}, concurrency_key="shared-key", organization_id="org-b")
    mine = rl.enqueue(db, MAIL, {"n": 2}, concurrency_key="shared-key", organization_id="org-a")
    scoped = Browser(create_app(db, authorize=allow_anyone, organization_id="org-a"))
    html = page(scoped, f"/jobs/{mine.id}")
    assert 'id="wait-reason">key_busy<' in html and "another organization holds its turn" in html
    assert str(theirs.id) not in html and 'id="blocking-job"' not in html


def test_a_job_that_is_not_pending_says_no_wait(db, client, mail):
    job = rl.enqueue(db, MAIL, {"n": 1}, priority=TOP)
    claim_jobs(db, worker_id="w", lease_ttl_seconds=60, limit=1, job_types=[MAIL])
    html = page(client, f"/jobs/{job.id}")
    assert 'id="job-status">LEASED<' in html and 'id="wait"' not in html


def test_the_overview_lists_the_queues_with_their_state_limits_and_counts(db, client, mail):
    rl.enqueue(db, MAIL, {"n": 1})
    rl.pause_queue(db, "mail")
    table = page(client, "/").split('id="overview-queues"', 1)[1].split("</table>", 1)[0]
    row = re.search(r'<tr data-queue="mail">(.*?)</tr>', table, re.S).group(1)
    assert cells(row) == ["mail", "paused", "global 2; key 1; rate 20 per 60 s", "1", "0", "0", "0"]
    assert '<a href="/queues">All queues' in page(client, "/")


def test_a_hostile_queue_name_is_escaped_on_every_page_and_can_be_paused(db, admin):
    rl.configure_queue(db, HOSTILE)
    for url in ("/", "/queues", f"/queues?queue={HOSTILE}", f"/queues?done=paused&name={HOSTILE}"):
        html = page(admin, url)
        assert "<script>alert" not in html and "<img src=x" not in html, url
    post_form(admin, "/queues", "/queues/pause_queue", {"name": HOSTILE})
    assert paused(db, HOSTILE)


def test_the_job_page_says_a_job_is_ready_once_a_live_worker_serves_its_queue_and_type(db, client, mail):
    job = rl.enqueue(db, MAIL, {"n": 1})
    record_worker(db, "worker-mail", queues=["mail"], job_types=[MAIL])
    html = page(client, f"/jobs/{job.id}")
    assert 'id="wait-reason">ready<' in html and "the next claim of a worker serving queue" in html
    record_worker(db, "worker-mail", queues=["default"], job_types=[MAIL])
    assert 'id="wait-reason">no_worker<' in page(client, f"/jobs/{job.id}")
