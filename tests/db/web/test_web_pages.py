"""The dashboard's pages through its WSGI app, against a real PostgreSQL: what each shows, filters and pages."""

from __future__ import annotations

from html import unescape
import re

import pytest

import runledger_sync as rl
from runledger_sync import testing
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import Browser, EMAIL, REPORT, TOP, dead_lettered, page, succeeded
from tests.support import claim_one, event_types

JOB_LINK = re.compile(r'href="/jobs/([0-9a-f-]{36})"')


def listed(html: str) -> list[str]:
    """The job ids of a jobs table, in page order."""
    return JOB_LINK.findall(html.split('id="jobs"', 1)[1])


def test_overview_counts_by_status_and_type(db, client):
    succeeded(db)
    dead_lettered(db, REPORT)
    rl.enqueue(db, EMAIL, {"n": 2})
    html = page(client, "/")
    assert re.search(r'id="count-succeeded">1<', html)
    assert re.search(r'id="count-dead_lettered">1<', html)
    assert re.search(r'id="count-pending">1<', html)
    by_type = html.split('id="by-type"', 1)[1]
    assert f'/jobs?type={EMAIL}&amp;status=SUCCEEDED">1<' in by_type
    assert f'/jobs?type={REPORT}&amp;status=DEAD_LETTERED">1<' in by_type


def test_overview_shows_recent_throughput_failures_by_code_and_workers(db, client):
    succeeded(db)
    succeeded(db)
    dead_lettered(db, REPORT)
    rl.enqueue(db, EMAIL, {"n": 3}, priority=TOP)
    claim_one(db, worker_id="worker-seen-7", job_type=EMAIL)
    html = page(client, "/")
    assert 'id="succeeded-recent">2<' in html
    assert 'id="failed-recent">1<' in html
    failures = html.split('id="failures"', 1)[1]
    assert re.search(r"<code>web\.bad_input</code></td><td>1</td>", failures)
    workers = html.split('id="workers"', 1)[1]
    assert re.search(r"<code>worker-seen-7</code></td><td>1</td>", workers)


def test_overview_reports_the_oldest_due_job(db, client):
    assert 'id="oldest-due">none due<' in page(client, "/")
    rl.enqueue(db, EMAIL, {"n": 1})
    assert re.search(r'id="oldest-due">\d+\.\d s<', page(client, "/"))


def test_jobs_list_filters_by_status_type_and_organization(db, client):
    done = succeeded(db, organization_id="org-a")
    dead = dead_lettered(db, REPORT, organization_id="org-b")
    pending = rl.enqueue(db, EMAIL, {"n": 1}, organization_id="org-b")
    assert listed(page(client, "/jobs")) == [str(pending.id), str(dead.id), str(done.id)]
    assert listed(page(client, "/jobs?status=SUCCEEDED")) == [str(done.id)]
    assert listed(page(client, f"/jobs?type={REPORT}")) == [str(dead.id)]
    assert listed(page(client, "/jobs?org=org-b")) == [str(pending.id), str(dead.id)]
    assert listed(page(client, f"/jobs?org=org-b&type={EMAIL}&status=PENDING")) == [str(pending.id)]


def test_jobs_list_searches_a_whole_id_or_an_idempotency_key_prefix(db, client):
    first = rl.enqueue(db, EMAIL, {"n": 1}, idempotency_key="order-41")
    second = rl.enqueue(db, EMAIL, {"n": 2}, idempotency_key="order-42")
    other = rl.enqueue(db, EMAIL, {"n": 3}, idempotency_key="refund_9")
    assert listed(page(client, f"/jobs?q={first.id}")) == [str(first.id)]
    assert listed(page(client, "/jobs?q=order-")) == [str(second.id), str(first.id)]
    assert listed(page(client, "/jobs?q=refund_")) == [str(other.id)]
    # LIKE wildcards typed in the box match themselves only.
    assert listed(page(client, "/jobs?q=order%25")) == []
    assert listed(page(client, "/jobs?q=refund%5F9")) == [str(other.id)]


def test_jobs_list_pages_by_keyset_until_every_job_was_shown_once(db, client):
    jobs = rl.enqueue_many(db, [rl.JobSpec(EMAIL, {"n": n}) for n in range(120)])
    seen: list[str] = []
    url = "/jobs?status=PENDING"
    while url:
        html = page(client, url)
        seen += listed(html)
        following = re.search(r'id="next-page" href="([^"]+)"', html)
        url = following.group(1).replace("&amp;", "&") if following else ""
    newest_first = sorted(jobs, key=lambda job: (job.created_at, job.id), reverse=True)
    assert seen == [str(job.id) for job in newest_first]


def test_a_page_cursor_naming_no_job_is_not_found(db, client):
    html = page(client, "/jobs?before=00000000-0000-7000-8000-000000000000", status=404)
    assert 'id="error-code">job.not_found<' in html


def test_job_page_shows_fields_attempts_timeline_and_output(db, client):
    job = succeeded(db, idempotency_key="invoice-7")
    html = page(client, f"/jobs/{job.id}")
    assert 'id="job-status">SUCCEEDED<' in html
    assert 'id="idempotency-key">invoice-7<' in html
    assert "web-worker" in html.split('id="attempts"', 1)[1]
    timeline = html.split('id="timeline"', 1)[1]
    assert [t for t in ("ENQUEUED", "SUCCEEDED") if f"<strong>{t}</strong>" in timeline] == ["ENQUEUED", "SUCCEEDED"]
    assert "&#34;sent&#34;: true" in html.split('id="output"', 1)[1]


def test_job_page_lists_enqueued_first_from_the_job_row_at_the_transitions_level(db, client):
    job = succeeded(db)
    assert event_types(db, job.id) == ["SUCCEEDED"]

    timeline = page(client, f"/jobs/{job.id}").split('id="timeline"', 1)[1]

    assert re.findall(r"<strong>([A-Z_]+)</strong>", timeline)[:2] == ["ENQUEUED", "SUCCEEDED"]


def test_job_page_shows_a_dead_lettered_jobs_final_stage(db, client):
    registry = rl.JobRegistry()

    @registry.job("web.crash", max_attempts=1)
    def crash(ctx: rl.JobContext, payload: dict) -> None:
        raise KeyError("to")

    registry.sync_definitions(db)
    job = testing.run_job(db, registry, "web.crash", {})
    assert rl.get_job(db, job.id).stage is rl.JobStage.RUNNING

    html = page(client, f"/jobs/{job.id}")

    assert "<dt>Stage</dt><dd>completed</dd>" in html


def test_job_page_sends_the_payload_only_when_asked(db, client):
    job = rl.enqueue(db, EMAIL, {"secret_marker": "ssn-123-45"})
    hidden = page(client, f"/jobs/{job.id}")
    assert "ssn-123-45" not in hidden and 'id="payload"' not in hidden
    assert f'href="/jobs/{job.id}?payload=1"' in hidden
    shown = page(client, f"/jobs/{job.id}?payload=1")
    assert "ssn-123-45" in shown.split('id="payload"', 1)[1]


def test_job_page_draws_the_start_of_a_large_value_and_says_how_to_get_the_rest(db, client):
    job = rl.enqueue(db, EMAIL, {"blob": "x" * 200_000, "tail_marker": "zz-end"})
    shown = page(client, f"/jobs/{job.id}?payload=1")
    drawn = unescape(shown.split('id="payload">', 1)[1].split("</pre>", 1)[0])
    assert len(drawn) == 20_000 and "zz-end" not in shown
    assert "more characters not shown" in shown and f"runledger-sync jobs show {job.id} --json" in shown
    assert len(shown) < 40_000
    assert rl.get_job(db, job.id).payload["tail_marker"] == "zz-end"


def test_job_page_of_an_unknown_or_malformed_id_is_an_error_page(db, client):
    assert 'job.not_found' in page(client, "/jobs/00000000-0000-7000-8000-000000000000", status=404)
    assert 'id="error-code">job.invalid_argument<' in page(client, "/jobs/" + "0" * 34, status=400)


def test_dead_letters_page_lists_failures_and_tells_replayed_from_dead(db, client):
    dead = dead_lettered(db, REPORT)
    replayed = dead_lettered(db, EMAIL)
    rl.requeue_job(db, replayed.id)
    html = page(client, "/dead-letters")
    rows = html.split('id="dead-letters"', 1)[1]
    assert re.search(rf"{dead.id}</code></a></td>.*?<td>dead</td>", rows, re.S)
    assert re.search(rf"{replayed.id}</code></a></td>.*?<td>replayed</td>", rows, re.S)
    assert str(replayed.id) not in page(client, f"/dead-letters?type={REPORT}")


def test_schedules_page_lists_every_schedule(db, client):
    rl.upsert_schedule(db, "nightly-report", cron_expr="0 0 3 * * *", job_type=REPORT)
    rl.upsert_schedule(db, "paused-one", cron_expr="@hourly", job_type=EMAIL, is_active=False)
    html = page(client, "/schedules").split('id="schedules"', 1)[1]
    assert re.search(r"<td>nightly-report</td>.*?<td>yes</td>", html, re.S)
    assert re.search(r"<td>paused-one</td>.*?<td>paused</td>", html, re.S)


def test_stylesheet_is_served_and_unknown_paths_are_not_found(db, client):
    response = client.get("/static/style.css")
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/css")
    assert "web.not_found" in page(client, "/nowhere", status=404)
    refused = client.post("/jobs")
    assert refused.status_code == 405 and refused.headers["Allow"] == "GET"
    assert 'id="error-code">web.method_not_allowed<' in refused.get_data(as_text=True)


def test_an_organization_scoped_dashboard_sees_only_its_organization(db):
    mine = dead_lettered(db, organization_id="org-a")
    theirs = dead_lettered(db, organization_id="org-b")
    scoped = Browser(create_app(db, authorize=allow_anyone, organization_id="org-a"))
    assert listed(page(scoped, "/jobs?org=org-b")) == [str(mine.id)]
    assert str(theirs.id) not in page(scoped, "/dead-letters")
    page(scoped, f"/jobs/{theirs.id}", status=404)
    assert 'id="count-dead_lettered">1<' in page(scoped, "/")


@pytest.mark.parametrize("scope", [lambda request: request.environ.get("HTTP_X_ORG"), "org-a"])
def test_the_scope_can_be_read_from_each_request(db, scope):
    mine = succeeded(db, organization_id="org-a")
    succeeded(db, organization_id="org-b")
    scoped = Browser(create_app(db, authorize=allow_anyone, organization_id=scope))
    response = scoped.get("/jobs", headers={"X-Org": "org-a"})
    assert listed(response.get_data(as_text=True)) == [str(mine.id)]


def order_workflow(organization_id=None, key="order-42"):
    wf = rl.Workflow("order.fulfil", idempotency_key=key, organization_id=organization_id)
    charge = wf.job("charge", EMAIL, {"order": 42})
    ship = wf.job("ship", REPORT, {"order": 42}, after=[charge], release="on_success")
    approve = wf.external("approve", after=[charge])
    wf.job("notify", EMAIL, {"order": 42}, after=[ship, approve])
    return wf


def test_workflows_page_lists_runs_and_draws_a_runs_steps_in_dependency_layers(db, client):
    run = rl.enqueue_workflow(db, order_workflow())
    listing = page(client, "/workflows").split('id="workflow-runs"', 1)[1]
    assert f'href="/workflows?run={run.id}"' in listing and "order.fulfil" in listing and "RUNNING" in listing
    graph = page(client, f"/workflows?run={run.id}").split('id="step-graph"', 1)[1]
    layers = [re.findall(r'data-step="([a-z]+)"', layer) for layer in graph.split('class="layer"')[1:]]
    assert layers == [["charge"], ["ship", "approve"], ["notify"]]
    charge_job = rl.get_workflow_run(db, run.id).step("charge").job_id
    assert f'href="/jobs/{charge_job}"' in graph
    assert "after ship, approve" in graph and "(on success)" in graph


def test_workflows_pages_keep_to_the_organization_and_answer_unknown_runs(db):
    mine = rl.enqueue_workflow(db, order_workflow("org-a", key="a"))
    theirs = rl.enqueue_workflow(db, order_workflow("org-b", key="b"))
    scoped = Browser(create_app(db, authorize=allow_anyone, organization_id="org-a"))
    listing = page(scoped, "/workflows")
    assert str(mine.id) in listing and str(theirs.id) not in listing
    assert "workflow.run_not_found" in page(scoped, f"/workflows?run={theirs.id}", status=404)
    assert "workflow.run_not_found" in page(scoped, "/workflows?run=00000000-0000-0000-0000-000000000000", status=404)
    page(scoped, "/workflows?run=not-a-uuid", status=400)


def test_workflow_names_and_step_keys_are_escaped(db, client):
    wf = rl.Workflow("<script>alert('run')</script>")
    wf.job("<img src=x onerror=alert(1)>", EMAIL, {})
    run = rl.enqueue_workflow(db, wf)
    for html in (page(client, "/workflows"), page(client, f"/workflows?run={run.id}")):
        assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in page(client, f"/workflows?run={run.id}")


def test_the_job_page_shows_its_metadata_escaped(db, client):
    job = rl.enqueue(db, EMAIL, {}, meta={"<b>tenant</b>": "<script>alert('meta')</script>", "request_id": "r-1"})

    html = page(client, f"/jobs/{job.id}")

    assert 'id="job-meta"' in html and "r-1" in html
    assert "<script>alert" not in html and "<b>tenant</b>" not in html
    assert "&lt;script&gt;alert(&#39;meta&#39;)&lt;/script&gt;" in html
    assert 'id="job-meta"' not in page(client, f"/jobs/{rl.enqueue(db, EMAIL, {}).id}")


def test_the_workflow_page_shows_the_runs_metadata_escaped(db, client):
    wf = rl.Workflow("order.meta", meta={"tenant": "<img src=x onerror=alert(1)>"})
    wf.job("charge", EMAIL, {})
    run = rl.enqueue_workflow(db, wf)

    html = page(client, f"/workflows?run={run.id}")

    assert 'id="run-meta"' in html and "<code>tenant</code>" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_the_workflow_page_draws_appended_steps_after_the_window_and_lists_the_appends(db, client):
    wf = rl.Workflow("crawl")
    listing = wf.job("list", EMAIL, {})
    wf.job("report", REPORT, {}, after=[listing, wf.external("collect")])
    run = rl.enqueue_workflow(db, wf)
    more = rl.WorkflowAppend(window="collect")
    more.job("page-1", EMAIL, {}, after=["list"])
    more.job("<b>page-2</b>", EMAIL, {}, after=["page-1"])
    rl.append_workflow_steps(db, run.id, more, mutation_key="<i>pages</i>")

    html = page(client, f"/workflows?run={run.id}")

    graph = html.split('id="step-graph"', 1)[1].split("</svg>", 1)[0]
    layers = [re.findall(r'data-step="([^"]+)"', layer) for layer in graph.split('class="layer"')[1:]]
    # report waits for the appended steps, so it is drawn after the last of them.
    assert layers == [["list", "collect"], ["page-1"], ["&lt;b&gt;page-2&lt;/b&gt;"], ["report"]]
    assert graph.count('data-appended-by="&lt;i&gt;pages&lt;/i&gt;"') == 2
    assert 'data-source="page-1" data-target="report"' in graph
    appends = html.split('id="mutations"', 1)[1].split("</table>", 1)[0]
    assert "&lt;i&gt;pages&lt;/i&gt;" in appends and "<code>collect</code>" in appends and "2: page-1" in appends
    assert "<b>page-2</b>" not in html and "<i>pages</i>" not in html
    assert 'id="mutations"' not in page(client, f"/workflows?run={rl.enqueue_workflow(db, order_workflow()).id}")
