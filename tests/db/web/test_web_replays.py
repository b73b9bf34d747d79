"""The job page's "Run again" as an audited replay: the actor from the authorize hook, a reason, one run per form."""

from __future__ import annotations

import re

from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import HOSTILE, EMAIL, Browser, allow_all, dead_lettered, page, post_form, succeeded
from tests.support import event_types

REPLAY_KEY = re.compile(r'name="replay_key" value="([0-9a-f]{32})"')


def as_user(user: str):
    def authorize(request, action):
        return user
    return authorize


def status_of(db, job: rl.JobRecord) -> tuple[str, int]:
    found = rl.get_job(db, job.id)
    return found.status.value, found.run_number


def replay_form(client: Client, job: rl.JobRecord) -> dict[str, str]:
    """What the job page's Run again form sends, as it was drawn, with a reason typed in."""
    shown = page(client, f"/jobs/{job.id}")
    key = REPLAY_KEY.search(shown)
    assert key is not None, "the page draws no replay form"
    return {"seen_status": job.status.value, "seen_run": str(job.run_number), "replay_key": key.group(1),
            "reason": "the mailbox is fixed"}


def test_run_again_records_a_replay_with_the_hooks_user_and_the_reason(db):
    job = dead_lettered(db)
    alice = Browser(create_app(db, read_only=False, authorize=as_user("alice")))
    form = replay_form(alice, job)

    response = post_form(alice, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", form)

    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{job.id}?done=replayed"
    assert status_of(db, job) == ("PENDING", 2)
    [replay] = rl.list_replays(db, job.id)
    assert (replay.actor, replay.reason, replay.replay_key) == ("alice", "the mailbox is fixed", form["replay_key"])
    assert (replay.expected_status, replay.expected_run_number, replay.run_number) == ("DEAD_LETTERED", 1, 2)
    shown = page(alice, f"/jobs/{job.id}?done=replayed")
    section = shown.split('<table id="replays">', 1)[1].split("</table>", 1)[0]
    assert all(part in section for part in ("alice", "the mailbox is fixed", form["replay_key"], "DEAD_LETTERED, run 1"))
    assert "<td>2</td>" in section


def test_a_form_sent_twice_replays_once_and_each_drawing_has_its_own_key(db, admin):
    job = dead_lettered(db)
    form = replay_form(admin, job)
    assert REPLAY_KEY.search(page(admin, f"/jobs/{job.id}")).group(1) != form["replay_key"]

    first = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", form)
    second = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", form)

    assert first.headers["Location"].endswith("done=replayed")
    assert second.headers["Location"].endswith("done=already_replayed")
    assert "nothing more was queued" in page(admin, second.headers["Location"])
    assert status_of(db, job) == ("PENDING", 2)
    assert event_types(db, job.id).count("REQUEUED") == 1 and len(rl.list_replays(db)) == 1


def test_a_blank_reason_a_stale_page_or_a_reused_key_is_refused_and_runs_nothing(db, admin):
    job = succeeded(db)
    form = replay_form(admin, job)
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", {**form, "reason": " "})
    assert response.status_code == 400 and "job.replay_reason_blank" in response.get_data(as_text=True)
    assert status_of(db, job) == ("SUCCEEDED", 1) and rl.list_replays(db) == []

    assert post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", form).status_code == 303
    rl.cancel_job(db, job.id)
    # The same form, another reason: the key names the first replay.
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", {**form, "reason": "again"})
    assert response.status_code == 409 and "job.replay_idempotency_conflict" in response.get_data(as_text=True)
    # A new drawing of the page, but the page it was drawn from showed run 1.
    fresh = replay_form(admin, rl.get_job(db, job.id))
    response = post_form(admin, f"/jobs/{job.id}", f"/jobs/{job.id}/replay_job", {**fresh, "seen_run": "1"})
    assert response.status_code == 409 and "job.requeue_expectation_failed" in response.get_data(as_text=True)
    assert status_of(db, job) == ("CANCELED", 2) and len(rl.list_replays(db)) == 1


def test_the_hook_is_asked_for_replay_job_and_a_refusal_hides_the_button_and_runs_nothing(db):
    job = dead_lettered(db)
    asked: list[str] = []

    def no_replays(request, action):
        asked.append(action)
        return action != "replay_job"

    refusing = Browser(create_app(db, read_only=False, authorize=no_replays, secret=b"shared"))
    assert 'id="replay-form"' not in page(refusing, f"/jobs/{job.id}")
    allowed = Browser(create_app(db, read_only=False, authorize=allow_all, secret=b"shared"))
    form = replay_form(allowed, job)
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page(allowed, f"/jobs/{job.id}")).group(1)
    refusing.set_cookie("runledger_csrf", allowed.get_cookie("runledger_csrf").value)
    response = refusing.post(f"/jobs/{job.id}/replay_job", data={**form, "csrf_token": token})
    assert response.status_code == 403 and "web.action_forbidden" in response.get_data(as_text=True)
    assert "replay_job" in asked
    assert status_of(db, job) == ("DEAD_LETTERED", 1) and rl.list_replays(db) == []


def test_a_replay_needs_the_token_and_the_dashboards_own_origin(db, admin):
    job = dead_lettered(db)
    form = replay_form(admin, job)
    response = admin.post(f"/jobs/{job.id}/replay_job", data=form)  # no CSRF token
    assert response.status_code == 403 and "web.csrf_rejected" in response.get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page(admin, f"/jobs/{job.id}")).group(1)
    response = admin.post(f"/jobs/{job.id}/replay_job", data={**form, "csrf_token": token},
                          headers={"Origin": "http://evil.example"})
    assert response.status_code == 403 and "web.cross_origin_rejected" in response.get_data(as_text=True)
    assert status_of(db, job) == ("DEAD_LETTERED", 1) and rl.list_replays(db) == []


def test_read_only_and_scoped_dashboards_cannot_replay(db):
    theirs = dead_lettered(db, organization_id="org-b")
    read_only = Browser(create_app(db, authorize=allow_all))
    assert 'id="replay-form"' not in page(read_only, f"/jobs/{theirs.id}")
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a"))
    response = post_form(scoped, "/dead-letters", f"/jobs/{theirs.id}/replay_job",
                         {"replay_key": "k", "reason": "not mine"})
    assert response.status_code == 404
    assert status_of(db, theirs) == ("DEAD_LETTERED", 1) and rl.list_replays(db) == []


def test_a_replays_user_controlled_fields_are_escaped(db):
    job = dead_lettered(db, EMAIL)
    rl.replay_job(db, job.id, replay_key=HOSTILE, reason=HOSTILE, actor=HOSTILE)
    shown = page(Browser(create_app(db, authorize=allow_all)), f"/jobs/{job.id}")
    assert HOSTILE not in shown and "&lt;script&gt;" in shown
