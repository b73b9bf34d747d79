"""Dead letters filtered by error code and exception type, replayed a whole filter at a time; late schedules and their zones."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.web import create_app, views_operations
from tests.db.web.conftest import Browser, CSRF_FIELD, HOSTILE, REPORT, allow_all, dead_lettered, page, post_form

TIMEOUT = "TimeoutError"


def listed(html: str) -> list[str]:
    table = html.split('id="dead-letters"', 1)[1]
    return re.findall(r'href="/jobs/([0-9a-f-]{36})"', table)


def states(db: Any, jobs: list[rl.JobRecord]) -> list[tuple[str, int]]:
    return [(found.status.value, found.run_number) for found in (rl.get_job(db, job.id) for job in jobs)]


def test_the_list_filters_by_error_code_and_exception_type_and_counts_what_is_replayable(db, client):
    timeout = dead_lettered(db, code="http.timeout", error_type=TIMEOUT)
    refused = dead_lettered(db, code="http.timeout", error_type="ConnectionRefusedError")
    declined = dead_lettered(db, code="card.declined")

    by_code = page(client, "/dead-letters?code=http.timeout")
    by_both = page(client, f"/dead-letters?code=http.timeout&error_type={TIMEOUT}")

    assert listed(by_code) == [str(refused.id), str(timeout.id)]
    assert listed(by_both) == [str(timeout.id)]
    assert listed(page(client, "/dead-letters?code=http.timeout&error_type=builtins.TimeoutError")) == [str(timeout.id)]
    assert listed(page(client, "/dead-letters?code=card.declined")) == [str(declined.id)]
    assert 'id="replayable-count"><strong>2</strong> job(s) matching this filter' in by_code
    # The filter is drawn back into its form, and each row's code and type link to their own filter.
    assert 'name="error_type" value="TimeoutError"' in by_both
    assert f'href="/dead-letters?type=&amp;code=http.timeout&amp;error_type={TIMEOUT}"' not in by_code
    assert f'href="/dead-letters?code=http.timeout&amp;error_type={TIMEOUT}"' in by_code


def test_replaying_the_filter_requeues_exactly_what_it_matches_and_keeps_the_filter(db, admin):
    chosen = [dead_lettered(db, code="http.timeout", error_type=TIMEOUT) for _ in range(3)]
    other_type = dead_lettered(db, code="http.timeout", error_type="OSError")
    other_code = dead_lettered(db, code="card.declined", error_type=TIMEOUT)
    url = f"/dead-letters?code=http.timeout&error_type={TIMEOUT}"
    assert 'id="replay-matching">Replay all 3 matching<' in page(admin, url)

    response = post_form(admin, url, "/dead-letters/replay_dead_letters", {"code": "http.timeout", "error_type": TIMEOUT})

    assert response.status_code == 303
    assert response.headers["Location"] == f"/dead-letters?replayed=3&code=http.timeout&error_type={TIMEOUT}"
    assert states(db, chosen) == [("PENDING", 2)] * 3
    assert states(db, [other_type, other_code]) == [("DEAD_LETTERED", 1)] * 2
    after = page(admin, response.headers["Location"])
    assert 'id="done">Requeued 3 job(s).<' in after and "<strong>0</strong>" in after and 'id="replay-matching"' not in after


def test_one_click_replays_at_most_its_cap_most_recent_first_and_says_so(db, admin, monkeypatch):
    monkeypatch.setattr(views_operations, "REPLAY_FILTER_LIMIT", 2)
    oldest, *newer = [dead_lettered(db, code="http.timeout") for _ in range(3)]
    html = page(admin, "/dead-letters")
    assert "<strong>more than 2</strong>" in html and 'id="replay-matching">Replay the 2 most recent matching<' in html

    response = post_form(admin, "/dead-letters", "/dead-letters/replay_dead_letters", {})

    assert response.headers["Location"] == "/dead-letters?replayed=2"
    assert states(db, [oldest, *newer]) == [("DEAD_LETTERED", 1), ("PENDING", 2), ("PENDING", 2)]
    after = page(admin, response.headers["Location"])
    assert "replay again for the rest" in after and "<strong>1</strong>" in after


def test_a_scoped_dashboard_replays_its_own_organization_whatever_the_form_says(db):
    ours = dead_lettered(db, code="http.timeout", organization_id="org-a")
    theirs = dead_lettered(db, code="http.timeout", organization_id="org-b")
    scoped = Browser(create_app(db, read_only=False, authorize=allow_all, organization_id="org-a"))

    response = post_form(scoped, "/dead-letters", "/dead-letters/replay_dead_letters", {"org": "org-b"})

    assert response.headers["Location"] == "/dead-letters?replayed=1"
    assert states(db, [ours, theirs]) == [("PENDING", 2), ("DEAD_LETTERED", 1)]


def test_replaying_a_filter_is_refused_read_only_without_a_token_from_elsewhere_or_by_the_hook(db, admin):
    job = dead_lettered(db, code="http.timeout")
    read_only = Browser(create_app(db, authorize=allow_all))
    assert 'id="replay-matching"' not in page(read_only, "/dead-letters")
    refusals = [(read_only.post("/dead-letters/replay_dead_letters", data={"csrf_token": "0" * 64}), "web.read_only")]
    token = CSRF_FIELD.search(page(admin, "/dead-letters")).group(1)
    refusals.append((admin.post("/dead-letters/replay_dead_letters", data={"code": "http.timeout"}), "web.csrf_rejected"))
    refusals.append((admin.post("/dead-letters/replay_dead_letters", data={"csrf_token": token},
                                headers={"Origin": "https://evil.example"}), "web.cross_origin_rejected"))
    ticks_only = Browser(create_app(db, read_only=False, authorize=lambda request, action: action in ("view", "replay")))
    assert 'id="replay-matching"' not in page(ticks_only, "/dead-letters")
    refusals.append((post_form(ticks_only, "/dead-letters", "/dead-letters/replay_dead_letters", {}), "web.action_forbidden"))

    for response, code in refusals:
        assert response.status_code == 403 and f'id="error-code">{code}<' in response.get_data(as_text=True), code
    assert states(db, [job]) == [("DEAD_LETTERED", 1)]


def test_a_bad_filter_is_refused_with_its_code(db, admin):
    dead_lettered(db)
    too_long = "x" * 300
    assert 'id="error-code">job.invalid_argument<' in page(admin, f"/dead-letters?error_type={too_long}", status=400)
    response = post_form(admin, "/dead-letters", "/dead-letters/replay_dead_letters", {"error_type": too_long})
    assert response.status_code == 400 and "job.invalid_argument" in response.get_data(as_text=True)


def test_hostile_filter_values_and_error_types_are_escaped(db, admin):
    dead_lettered(db, code="http.timeout", error_type=HOSTILE)
    for url in (f"/dead-letters?code={HOSTILE}&error_type={HOSTILE}", f"/dead-letters?error_type={HOSTILE}", "/dead-letters"):
        html = page(admin, url)
        assert "<script>alert" not in html and "<img src=x" not in html, url
    html = page(admin, f"/dead-letters?error_type={HOSTILE}")
    assert len(listed(html)) == 1
    assert 'name="error_type" value="&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;' in html


# -- schedules -----------------------------------------------------------------------------------


def due_ago(db: Any, name: str, seconds: int) -> None:
    with db.begin() as connection:
        connection.execute(text("UPDATE job_schedules SET next_fire_at = now() - make_interval(secs => :s) WHERE name = :n"),
                           {"s": seconds, "n": name})


def test_a_schedule_overdue_past_the_grace_is_flagged_late(db, client):
    for name in ("stuck", "just-due", "paused-stuck", "future"):
        rl.upsert_schedule(db, name, cron_expr="@daily", job_type=REPORT)
    due_ago(db, "stuck", 3 * 3600 + 125)
    due_ago(db, "just-due", 5)  # within the grace: a scheduler's next tick fires it
    due_ago(db, "paused-stuck", 3 * 3600)
    rl.pause_schedule(db, "paused-stuck")

    html = page(client, "/schedules")

    rows = dict(re.findall(r'<tr data-schedule="([a-z-]+)"( class="late")?>', html))
    assert rows == {"stuck": ' class="late"', "just-due": "", "paused-stuck": "", "future": ""}
    stuck = html.split('data-schedule="stuck"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="badge late">late by 3 h 2 min</span>' in stuck
    assert 'id="late-notice">1 active schedule(s) should have fired more than 60 s ago' in html


def test_times_are_shown_in_utc_and_in_the_schedules_own_zone(db, client):
    rl.upsert_schedule(db, "berlin", cron_expr="0 0 3 * * *", job_type=REPORT, timezone="Europe/Berlin")
    rl.upsert_schedule(db, "utc", cron_expr="0 0 3 * * *", job_type=REPORT)
    schedule = rl.get_schedule(db, "berlin")

    html = page(client, "/schedules")

    berlin = html.split('data-schedule="berlin"', 1)[1].split("</tr>", 1)[0]
    assert schedule.next_fire_at.strftime("%Y-%m-%d %H:%M:%S UTC") in berlin
    assert re.search(r'<span class="zone">\d{4}-\d\d-\d\d 03:00:00 CES?T \(UTC\+0[12]00\)</span>', berlin)
    assert 'class="zone"' not in html.split('data-schedule="utc"', 1)[1].split("</tr>", 1)[0]


def test_the_jobs_list_filters_by_metadata_and_keeps_it_across_pages(db, client, monkeypatch):
    from runledger_sync.web import views_jobs
    acme = [rl.enqueue(db, REPORT, {"n": n}, meta={"tenant": "acme", "region": "eu"}) for n in range(3)]
    rl.enqueue(db, REPORT, {}, meta={"tenant": "globex"})
    monkeypatch.setattr(views_jobs, "PAGE_SIZE", 2)

    first = page(client, "/jobs?meta=tenant%3Dacme%2C+region%3Deu")

    shown = re.findall(r'href="/jobs/([0-9a-f-]{36})"', first.split('id="jobs"', 1)[1])
    assert shown == [str(acme[2].id), str(acme[1].id)]
    assert 'name="meta" value="tenant=acme, region=eu"' in first
    older = re.search(r'id="next-page" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert "meta=tenant" in older
    rest = page(client, older)
    assert re.findall(r'href="/jobs/([0-9a-f-]{36})"', rest.split('id="jobs"', 1)[1]) == [str(acme[0].id)]
    assert 'id="error-code">job.invalid_meta<' in page(client, "/jobs?meta=tenant", status=400)
