"""The jobs list's bulk actions: a confirmation page with the dry-run count that changes nothing, then one audited action."""

from __future__ import annotations

import html
import re
import threading
from typing import Any

from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.web import allow_anyone, create_app
from runledger_sync.web.csrf import COOKIE_NAME
from tests.db.web.conftest import EMAIL, HOSTILE, REPORT, Browser, allow_all, dead_lettered, page, post_form
from tests.support import event_types

DRAWN_AT = re.compile(r'name="drawn_at" value="([^"]+)"')
ACME = "tenant=acme"


def as_user(user: str):
    def authorize(request, action):
        return user
    return authorize


def enqueue_tenants(db: Any, acme: int = 3, globex: int = 1) -> list[rl.JobRecord]:
    jobs = [rl.enqueue(db, EMAIL, {"n": n}, meta={"tenant": "acme"}) for n in range(acme)]
    for n in range(globex):
        rl.enqueue(db, EMAIL, {"n": n}, meta={"tenant": "globex"})
    return jobs


def statuses(db: Any, tenant: str) -> list[str]:
    return sorted(job.status.value for job in rl.list_jobs(db, meta={"tenant": tenant}))


def token_of(client: Client, url: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page(client, url))
    assert found is not None, f"{url} draws no form"
    return found.group(1)


def confirm_form(client: Client, url: str) -> dict[str, str]:
    """What the confirmation page's form sends, as drawn (besides the token), with a reason typed in."""
    shown = page(client, url)
    fields = dict(re.findall(r'<input type="hidden" name="(status|type|org|meta|priority|run_at|drawn_at)" value="([^"]*)"',
                             shown))
    return {**{name: html.unescape(value) for name, value in fields.items()}, "reason": "tenant offboarded"}


def test_the_confirmation_page_shows_the_dry_run_count_and_the_filter_and_changes_nothing(db, admin):
    enqueue_tenants(db)

    shown = page(admin, f"/jobs/bulk_cancel?type={EMAIL}&meta={ACME}")

    assert re.search(r'<strong id="dry-run-count">3</strong>', shown)
    words = shown.split('id="filter-words">', 1)[1].split("</ul>", 1)[0]
    assert f"<code>{EMAIL}</code>" in words and "<code>tenant=acme</code>" in words
    assert 'id="bulk-submit"' in shown and "Cancel 3 job(s)" in shown
    assert statuses(db, "acme") == ["PENDING"] * 3 and rl.list_operations(db) == []


def test_the_jobs_list_links_each_action_with_its_filter(db, admin, client):
    enqueue_tenants(db)
    shown = page(admin, f"/jobs?meta={ACME}&status=PENDING")
    toolbar = shown.split('id="bulk-actions"', 1)[1].split("</p>", 1)[0]
    assert 'href="/jobs/bulk_cancel?status=PENDING&amp;meta=tenant%3Dacme"' in toolbar
    assert "bulk_update" in toolbar and "bulk_retry" not in toolbar and "bulk_delete" not in toolbar
    # Read-only (the client fixture's default) draws none, and neither does an id search the filter cannot carry.
    assert 'id="bulk-actions"' not in page(client, f"/jobs?meta={ACME}")
    assert 'id="bulk-actions"' not in page(admin, f"/jobs?meta={ACME}&q=abc")


def test_the_confirmations_post_acts_once_and_records_the_hooks_user(db):
    enqueue_tenants(db)
    alice = Browser(create_app(db, read_only=False, authorize=as_user("alice")))
    url = f"/jobs/bulk_cancel?type={EMAIL}&meta={ACME}"
    form = {**confirm_form(alice, url), "csrf_token": token_of(alice, url)}

    response = alice.post("/jobs/bulk_cancel", data=form)

    assert response.status_code == 303
    [operation] = rl.list_operations(db)
    assert response.headers["Location"] == f"/operations?done={operation.id}"
    assert (operation.actor, operation.action, operation.reason) == ("alice", "cancel", "tenant offboarded")
    assert operation.filter == {"job_types": [EMAIL], "meta": {"tenant": "acme"}}
    assert (operation.matched, operation.changed, operation.status) == (3, 3, "SUCCEEDED")
    assert statuses(db, "acme") == ["CANCELED"] * 3 and statuses(db, "globex") == ["PENDING"]
    done = page(alice, response.headers["Location"])
    notice = done.split('id="done">', 1)[1].split("</p>", 1)[0]
    assert "Cancel by alice: 3 matched, 3 changed" in notice
    assert f'id="operation-{operation.id}" class="current"' in done

    # The same confirmation sent again (a double click, a resubmit) acts no more and says so.
    again = alice.post("/jobs/bulk_cancel", data=form)
    assert again.headers["Location"] == f"/operations?done={operation.id}&again=1"
    assert len(rl.list_operations(db)) == 1
    assert "was already acted on" in page(alice, again.headers["Location"])


def test_a_new_confirmation_of_work_already_done_acts_and_says_nothing_changed(db, admin):
    enqueue_tenants(db)
    url = f"/jobs/bulk_cancel?meta={ACME}"
    token = token_of(admin, url)
    post_form(admin, url, "/jobs/bulk_cancel", confirm_form(admin, url))

    assert "Nothing to cancel." in page(admin, url)
    form = {"meta": ACME, "reason": "once more", "drawn_at": "not a time", "csrf_token": token}
    second = admin.post("/jobs/bulk_cancel", data=form)
    shown = page(admin, second.headers["Location"])
    assert "0 matched, 0 changed" in shown and "Nothing was changed" in shown
    assert [operation.changed for operation in rl.list_operations(db)] == [0, 3]


def test_a_confirmation_sent_twice_at_once_runs_each_job_once(db):
    letters = [dead_lettered(db, meta={"tenant": "acme"}) for _ in range(3)]
    app = create_app(db, read_only=False, authorize=as_user("alice"))
    first = Browser(app)
    url = f"/jobs/bulk_retry?meta={ACME}"
    form = {**confirm_form(first, url), "csrf_token": token_of(first, url)}
    second = Browser(app)  # a second tab of the same browser: its cookie, the same drawn form
    second.set_cookie(COOKIE_NAME, first.get_cookie(COOKIE_NAME).value)
    start = threading.Barrier(2)
    answers: list[int] = []

    def send(client: Client) -> None:
        start.wait(10)
        answers.append(client.post("/jobs/bulk_retry", data=form).status_code)

    threads = [threading.Thread(target=send, args=(client,)) for client in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert answers == [303, 303]
    # Sent together, both may act (the second finds the jobs run again already); never twice on a job.
    assert [rl.get_job(db, job.id).run_number for job in letters] == [2, 2, 2]
    assert all(event_types(db, job.id).count("REQUEUED") == 1 for job in letters)
    operations = rl.list_operations(db)
    assert 1 <= len(operations) <= 2 and sum(operation.changed for operation in operations) == 3


def test_retry_delete_and_update_act_through_their_confirmations(db, admin):
    letters = [dead_lettered(db, meta={"tenant": "acme"}) for _ in range(2)]
    pending = rl.enqueue(db, REPORT, {}, meta={"tenant": "acme"})

    retry_url = f"/jobs/bulk_retry?status=DEAD_LETTERED&meta={ACME}"
    post_form(admin, retry_url, "/jobs/bulk_retry", confirm_form(admin, retry_url))
    assert [rl.get_job(db, job.id).run_number for job in letters] == [2, 2]

    update_url = f"/jobs/bulk_update?type={REPORT}&priority=77&run_at=2030-01-02T03:04"
    assert '<strong id="dry-run-count">1</strong>' in page(admin, update_url)
    post_form(admin, update_url, "/jobs/bulk_update", confirm_form(admin, update_url))
    updated = rl.get_job(db, pending.id)
    assert updated.priority == 77 and updated.next_run_at.isoformat() == "2030-01-02T03:04:00+00:00"
    assert rl.list_operations(db)[0].changes == {"priority": 77, "run_at": "2030-01-02T03:04:00+00:00"}

    rl.cancel_job(db, pending.id)
    delete_url = f"/jobs/bulk_delete?type={REPORT}&status=CANCELED"
    post_form(admin, delete_url, "/jobs/bulk_delete", confirm_form(admin, delete_url))
    assert rl.get_job(db, pending.id) is None
    assert [operation.action for operation in rl.list_operations(db)] == ["delete", "update", "retry"]


def test_the_update_page_asks_what_to_set_before_counting(db, admin):
    enqueue_tenants(db)
    shown = page(admin, f"/jobs/bulk_update?meta={ACME}")
    assert 'id="update-priority"' in shown and 'id="dry-run-count"' not in shown and 'id="bulk-confirm"' not in shown
    refused = page(admin, f"/jobs/bulk_update?meta={ACME}&priority=high", 400)
    assert '<code id="error-code">job.invalid_update</code>' in refused


def test_read_only_refuses_the_page_and_the_post(db, client):
    enqueue_tenants(db)
    assert "web.read_only" in page(client, f"/jobs/bulk_cancel?meta={ACME}", 403)
    response = client.post("/jobs/bulk_cancel", data={"meta": ACME, "reason": "r"})
    assert response.status_code == 403 and "web.read_only" in response.get_data(as_text=True)
    assert statuses(db, "acme") == ["PENDING"] * 3 and rl.list_operations(db) == []


def test_a_post_from_another_origin_or_without_the_token_is_refused(db, admin):
    enqueue_tenants(db)
    url = f"/jobs/bulk_cancel?meta={ACME}"
    form = confirm_form(admin, url)
    token = token_of(admin, url)

    foreign = admin.post("/jobs/bulk_cancel", data={**form, "csrf_token": token},
                         headers={"Origin": "http://evil.example"})
    no_token = admin.post("/jobs/bulk_cancel", data=form)
    no_origin = Client(create_app(db, read_only=False, authorize=allow_all)).post(
        "/jobs/bulk_cancel", data={**form, "csrf_token": token})

    assert (foreign.status_code, no_token.status_code, no_origin.status_code) == (403, 403, 403)
    assert "web.cross_origin_rejected" in foreign.get_data(as_text=True)
    assert "web.csrf_rejected" in no_token.get_data(as_text=True)
    assert "web.origin_missing" in no_origin.get_data(as_text=True)
    assert statuses(db, "acme") == ["PENDING"] * 3 and rl.list_operations(db) == []


def test_a_token_drawn_for_one_user_is_refused_for_another(db):
    enqueue_tenants(db)
    signed_in = {"user": "alice"}
    browser = Browser(create_app(db, read_only=False, authorize=lambda request, action: signed_in["user"]))
    url = f"/jobs/bulk_cancel?meta={ACME}"
    form = confirm_form(browser, url)
    token = token_of(browser, url)

    signed_in["user"] = "bob"  # the same browser and cookie, another user: alice's form is not bob's
    refused = browser.post("/jobs/bulk_cancel", data={**form, "csrf_token": token})

    assert refused.status_code == 403 and "web.csrf_rejected" in refused.get_data(as_text=True)
    signed_in["user"] = "alice"
    assert browser.post("/jobs/bulk_cancel", data={**form, "csrf_token": token}).status_code == 303
    assert [operation.actor for operation in rl.list_operations(db)] == ["alice"]


def test_the_hook_is_asked_about_the_bulk_action_for_the_page_and_the_post(db):
    enqueue_tenants(db)
    asked: list[str] = []

    def no_bulk(request, action):
        asked.append(action)
        return "alice" if not action.startswith("bulk_") else False

    client = Browser(create_app(db, read_only=False, authorize=no_bulk))
    assert 'id="bulk-actions"' not in page(client, f"/jobs?meta={ACME}")
    refused = page(client, f"/jobs/bulk_cancel?meta={ACME}", 403)
    assert '<code id="error-code">web.action_forbidden</code>' in refused and "bulk_cancel" in asked
    token = token_of(client, f"/jobs/{rl.list_jobs(db)[0].id}")  # the job page's cancel form
    response = client.post("/jobs/bulk_delete", data={"meta": ACME, "reason": "r", "csrf_token": token})
    assert response.status_code == 403 and asked[-1] == "bulk_delete"
    assert statuses(db, "acme") == ["PENDING"] * 3 and rl.list_operations(db) == []


def test_an_empty_filter_is_refused_with_its_code_on_the_page_and_the_post(db, admin):
    enqueue_tenants(db)
    refused = page(admin, "/jobs/bulk_cancel", 400)
    assert '<code id="error-code">job.empty_filter</code>' in refused
    assert "at least one criterion for cancel" in refused
    token = token_of(admin, f"/jobs/bulk_cancel?meta={ACME}")
    response = admin.post("/jobs/bulk_cancel", data={"reason": "everything", "csrf_token": token})
    assert response.status_code == 400 and "job.empty_filter" in response.get_data(as_text=True)
    # A status the action does not take, and an id search it cannot carry, are refused with theirs.
    assert "job.invalid_filter" in page(admin, "/jobs/bulk_delete?status=PENDING", 400)
    assert "job.invalid_filter" in page(admin, f"/jobs/bulk_cancel?meta={ACME}&q=abc", 400)
    assert statuses(db, "acme") == ["PENDING"] * 3 and rl.list_operations(db) == []


def test_a_scoped_dashboard_adds_its_organization_and_still_wants_a_criterion(db):
    rl.enqueue(db, EMAIL, {}, organization_id="acme")
    rl.enqueue(db, EMAIL, {}, organization_id="globex")
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="acme"))
    assert "job.empty_filter" in page(scoped, "/jobs/bulk_cancel", 400)
    url = f"/jobs/bulk_cancel?type={EMAIL}&org=globex"
    assert '<strong id="dry-run-count">1</strong>' in page(scoped, url)
    post_form(scoped, url, "/jobs/bulk_cancel", confirm_form(scoped, url))
    assert {job.organization_id: job.status.value for job in rl.list_jobs(db)} == {"acme": "CANCELED", "globex": "PENDING"}
    rl.cancel_jobs(db, rl.JobFilter(organization_id="globex"), reason="elsewhere", actor="root")
    shown = page(scoped, "/operations")
    assert "elsewhere" not in shown and "organization_id: acme" in shown


def test_filter_values_reason_and_actor_are_escaped(db):
    rl.enqueue(db, EMAIL, {}, meta={"tenant": HOSTILE})
    hostile = Browser(create_app(db, read_only=False, authorize=as_user(HOSTILE)))
    url = f"/jobs/bulk_cancel?type={EMAIL}&meta=tenant%3D{HOSTILE.replace('&', '%26')}"
    shown = page(hostile, url)
    assert "<script>" not in shown and "&lt;script&gt;" in shown
    assert '<strong id="dry-run-count">1</strong>' in shown
    form = {**confirm_form(hostile, url), "reason": HOSTILE}
    response = post_form(hostile, url, "/jobs/bulk_cancel", form)
    operations = page(hostile, response.headers["Location"])
    assert "<script>" not in operations and "<img" not in operations
    assert operations.count("&lt;script&gt;") >= 3  # the actor, the reason, the filter
    [operation] = rl.list_operations(db)
    assert (operation.actor, operation.reason, operation.filter["meta"]) == (HOSTILE, HOSTILE, {"tenant": HOSTILE})
    # An id search that cannot be carried is named in the refusal, escaped.
    assert "<script>" not in page(hostile, f"/jobs/bulk_cancel?meta={ACME}&q=<script>", 400)


def test_the_operations_page_lists_every_action_and_is_in_the_navigation(db):
    enqueue_tenants(db)
    rl.cancel_jobs(db, rl.JobFilter(meta={"tenant": "globex"}), reason="from code", actor="ops-bot")
    client = Client(create_app(db, authorize=allow_anyone))
    assert '<a href="/operations">Operations</a>' in page(client, "/")
    shown = page(client, "/operations")
    row = shown.split('<tbody>', 1)[1].split("</tr>", 1)[0]
    for part in ("ops-bot", "cancel", "from code", "meta: tenant=globex", "<td>1</td>", "SUCCEEDED"):
        assert part in row, part
