"""The overview's charts (from the rollup) and the live updates' markup and policy, through the WSGI app."""

from __future__ import annotations

import re

from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import Browser, EMAIL, dead_lettered, page

LIVE_PAGES = ["/jobs", "/queues", "/dead-letters", "/workflows", "/schedules"]


def sample_minutes(db) -> None:
    """Three sampled minutes of the last hour, as the sampler writes them; one not sampled between them."""
    with db.begin() as conn:
        conn.execute(text(
            "INSERT INTO job_rollup_minutes (minute, queue, succeeded, retried, dead_lettered, canceled, ready, "
            "oldest_due_wait_seconds) VALUES "
            "(date_trunc('minute', now()) - interval '2 minutes', 'default', 30, 5, 1, 2, 12, 7.5), "
            "(date_trunc('minute', now()) - interval '4 minutes', 'default', 20, 0, 0, 0, 3, NULL), "
            "(date_trunc('minute', now()) - interval '5 minutes', 'default', 10, 1, 0, 0, 0, NULL)"))


def figure(html: str, chart_id: str) -> str:
    return html.split(f'id="{chart_id}"', 1)[1].split("</figure>", 1)[0]


def test_the_overview_draws_three_charts_with_axes_a_legend_and_accessible_names(db, client):
    sample_minutes(db)
    html = page(client, "/")

    throughput = figure(html, "chart-throughput")
    assert 'role="img" aria-labelledby="chart-throughput-title chart-throughput-desc"' in throughput
    assert '<title id="chart-throughput-title">Attempts finished per minute</title>' in throughput
    assert ("Per minute over the last 60 minutes: 60 succeeded, 6 retried, 1 dead-lettered, 2 canceled attempts."
            in throughput)
    assert re.findall(r'<li><span class="swatch ([a-z-]+)"></span>', throughput) == [
        "succeeded", "retried", "dead-lettered", "canceled"]
    # Stacked bars: three minutes of successes, two with retries, one each dead-lettered and canceled.
    assert [len(re.findall(rf'<rect class="{kind}"', throughput)) for kind in
            ("succeeded", "retried", "dead-lettered", "canceled")] == [3, 2, 1, 1]
    assert "<title>" in throughput.split('<g class="marks">', 1)[1]  # each bar says its minute and counts
    y_labels = re.findall(r'text-anchor="end">([^<]+)</text>', throughput)
    assert y_labels[0] == "0" and len(y_labels) >= 2
    assert len(re.findall(r'text-anchor="middle">\d\d:\d\d</text>', throughput)) >= 5

    ready = figure(html, "chart-ready")
    assert "latest: due jobs 12 jobs" in ready
    assert len(re.findall(r'<polyline class="line due"', ready)) == 2  # broken where minute -3 was not sampled
    assert "latest: oldest wait 7.5 s" in figure(html, "chart-wait")


def test_the_charts_show_one_queue_when_asked_and_every_queue_otherwise(db, client):
    sample_minutes(db)
    rl.configure_queue(db, "reports")
    with db.begin() as conn:
        conn.execute(text("INSERT INTO job_rollup_minutes (minute, queue, succeeded) "
                          "VALUES (date_trunc('minute', now()) - interval '2 minutes', 'reports', 4)"))
    every = figure(page(client, "/"), "chart-throughput")
    assert "64 succeeded" in every
    html = page(client, "/?queue=reports")
    assert "Queue reports, minute by minute" in html
    assert '<option value="reports" selected>' in html
    assert "4 succeeded" in figure(html, "chart-throughput")
    assert "64 succeeded" in figure(page(client, "/?queue=<nowhere>"), "chart-throughput")


def test_a_chart_with_no_sample_says_so_and_still_has_its_axes(db, client):
    html = page(client, "/")
    for chart_id in ("chart-throughput", "chart-ready", "chart-wait"):
        drawn = figure(html, chart_id)
        assert "no minute sampled yet" in drawn
        assert 'class="x-axis"' in drawn and 'class="y-axis"' in drawn


def test_a_scoped_overview_shows_no_chart_of_every_organizations_jobs(db):
    sample_minutes(db)
    html = page(Browser(create_app(db, authorize=lambda request, action: True, organization_id="org-a")), "/")
    assert 'id="charts-scoped"' in html and 'id="chart-throughput"' not in html


def test_pages_that_change_carry_data_live_and_the_one_script_from_this_origin(db, client):
    job = dead_lettered(db)
    for url in [*LIVE_PAGES, f"/jobs/{job.id}", "/"]:
        html = page(client, url)
        assert re.search(r'<main data-live="\d+">', html), url
        assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/live.js" defer>'], url
    assert "<main>" in page(client, "/?refresh=0")


def test_every_page_policy_allows_scripts_and_fetches_from_this_origin_only(db, client):
    rl.enqueue(db, EMAIL, {})
    policy = client.get("/jobs").headers["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert "unsafe" not in policy and "nonce" not in policy


def test_the_script_is_served_to_anyone_like_the_stylesheet_with_its_type(db):
    anonymous = Browser(create_app(db))  # no hook: no page, but the static files
    response = anonymous.get("/static/live.js")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    body = response.get_data(as_text=True)
    assert "data-live" in body and "visibilitychange" in body and "live-toggle" in body
    assert anonymous.get("/").status_code == 403
