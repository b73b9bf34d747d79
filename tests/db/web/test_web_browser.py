"""The dashboard in a real headless Chromium, driven by Selenium, over a real HTTP server and PostgreSQL.

Chromium and its driver come from the system (Debian's ``chromium`` and
``chromium-driver``); Selenium Manager is kept offline so nothing is downloaded.
Without them these tests skip, saying so, except under CI=true, where they fail.
Each page visited is saved as a PNG in tests/artifacts/screenshots/. With
RUNLEDGER_UPDATE_SCREENSHOTS=1 the screenshots the docs show (docs/screenshots/)
are made again from the same pages.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import EMAIL, REPO, TOP, allow_all, dead_lettered, finish, serving
from runledger_sync.store.claim.claim import claim_jobs
from tests.db.web.screenshot_data import seed_showcase
from tests.support import define

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 800)
ARTIFACTS = REPO / "tests" / "artifacts" / "screenshots"
README_SCREENSHOTS = REPO / "docs" / "screenshots"


def _require_chromium() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if not missing:
        return
    reason = f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the browser tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    _require_chromium()
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    # The page area itself, not the window around it, is WINDOW: the screenshots' size.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def chrome(browser) -> webdriver.Chrome:
    browser.delete_all_cookies()
    return browser


def snap(driver: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    target = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(target)), f"no screenshot for {name}"
    return target


def for_the_docs(*screenshots: Path) -> None:
    """Copy screenshots into docs/screenshots/ when asked to (RUNLEDGER_UPDATE_SCREENSHOTS=1)."""
    if os.environ.get("RUNLEDGER_UPDATE_SCREENSHOTS") != "1":
        return
    README_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for screenshot in screenshots:
        shutil.copyfile(screenshot, README_SCREENSHOTS / screenshot.name)


def text_of(driver: webdriver.Chrome, element_id: str) -> str:
    """The text of an element, waiting for it: a click or a submit may still be loading the next page."""
    return WebDriverWait(driver, 15).until(lambda d: d.find_element(By.ID, element_id)).text


def test_overview_leads_to_a_job_page_and_its_payload(db, chrome):
    showcase = seed_showcase(db)
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/")
        assert chrome.title == "Overview · runledger"
        assert text_of(chrome, "count-dead_lettered") == str(rl.count_jobs(db, status="DEAD_LETTERED"))
        overview = snap(chrome, "overview")

        chrome.find_element(By.LINK_TEXT, "Jobs").click()
        assert chrome.title == "Jobs · runledger"
        snap(chrome, "jobs")
        chrome.get(f"{base}/jobs?q={showcase.idempotency_key}")
        chrome.find_element(By.CSS_SELECTOR, "a.job-link").click()
        assert text_of(chrome, "job-status") == "DEAD_LETTERED"
        assert not chrome.find_elements(By.ID, "payload")
        job_page = snap(chrome, "job")

        chrome.find_element(By.ID, "show-payload").click()
        assert showcase.payload_marker in text_of(chrome, "payload")
        snap(chrome, "job-payload")
        for name, path in (("dead-letters", "/dead-letters"), ("schedules", "/schedules"), ("workflows", "/workflows")):
            chrome.get(base + path)
            snap(chrome, name)
        chrome.find_element(By.CSS_SELECTOR, "#workflow-runs a").click()
        drawn = [[step.get_attribute("data-step") for step in layer.find_elements(By.CSS_SELECTOR, ".step")]
                 for layer in WebDriverWait(chrome, 15).until(
                     lambda d: d.find_elements(By.CSS_SELECTOR, "#step-graph .layer"))]
        assert drawn == [["charge"], ["receipt", "approval"], ["deliver"]]
        snap(chrome, "workflow-run")
    for_the_docs(overview, job_page)


def test_replay_a_dead_letter_by_clicking(db, chrome):
    job, other = dead_lettered(db), dead_lettered(db)
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/dead-letters")
        chrome.find_element(By.ID, f"replay-{job.id}").click()
        assert text_of(chrome, "done") == "Requeued 1 job(s)."
        snap(chrome, "dead-letters-replayed")
    replayed = rl.get_job(db, job.id)
    assert (replayed.status, replayed.run_number, replayed.status_reason) == (rl.JobStatus.PENDING, 2, "DEAD_LETTER_REPLAY")
    assert rl.get_job(db, other.id).status is rl.JobStatus.DEAD_LETTERED


def test_bulk_replay_of_ticked_dead_letters(db, chrome):
    first, second, left = dead_lettered(db), dead_lettered(db), dead_lettered(db)
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/dead-letters")
        for job in (first, second):
            chrome.find_element(By.CSS_SELECTOR, f'input[type=checkbox][value="{job.id}"]').click()
        chrome.find_element(By.ID, "replay-chosen").click()
        assert text_of(chrome, "done") == "Requeued 2 job(s)."
    assert [rl.get_job(db, j.id).status for j in (first, second, left)] == [
        rl.JobStatus.PENDING, rl.JobStatus.PENDING, rl.JobStatus.DEAD_LETTERED]


def test_a_form_posted_without_the_browsers_csrf_cookie_is_refused(db, chrome):
    job = dead_lettered(db)
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/dead-letters")
        # As if another site made this browser post the form: the token is there, the cookie is not.
        chrome.delete_cookie("runledger_csrf")
        chrome.find_element(By.ID, f"replay-{job.id}").click()
        assert text_of(chrome, "error-code") == "web.csrf_rejected"
        snap(chrome, "csrf-refused")
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_read_only_dashboard_draws_no_actions_and_refuses_a_forged_post(db, chrome):
    job = dead_lettered(db)
    pending = rl.enqueue(db, EMAIL, {"n": 1})
    with serving(create_app(db, authorize=allow_all)) as base:
        chrome.get(base + "/dead-letters")
        assert not chrome.find_elements(By.CSS_SELECTOR, "button.replay-one")
        chrome.get(f"{base}/jobs/{pending.id}")
        assert not chrome.find_elements(By.ID, "cancel-job")
        chrome.execute_script(
            "const form = document.createElement('form'); form.method = 'post'; form.action = arguments[0];"
            "const id = document.createElement('input'); id.name = 'job_id'; id.value = arguments[1];"
            "form.appendChild(id); document.body.appendChild(form); form.submit();",
            base + "/dead-letters/replay", str(job.id),
        )
        assert text_of(chrome, "error-code") == "web.read_only"
        snap(chrome, "read-only-refused")
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_cancel_by_clicking_on_the_job_page(db, chrome):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(f"{base}/jobs/{job.id}")
        chrome.find_element(By.ID, "cancel-job").click()
        assert text_of(chrome, "done") == "The job was canceled."
        snap(chrome, "job-canceled")
    assert rl.get_job(db, job.id).status is rl.JobStatus.CANCELED


#: A page on another port of the same host: the same *site*, so the dashboard's SameSite cookie goes along.
ATTACKER_PAGE = """<!doctype html><title>prize</title>
<form id="forged" method="post" action="{action}"><input type="hidden" name="csrf_token" value="{token}"></form>
<script>document.getElementById("forged").submit();</script>"""


def test_a_form_auto_posted_from_another_port_of_the_same_host_is_refused(db, chrome):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(f"{base}/jobs/{job.id}")
        # The worst case: the attacker holds a token valid for this very browser.
        token = chrome.find_element(By.CSS_SELECTOR, "form.inline input[name=csrf_token]")
        html = ATTACKER_PAGE.format(action=f"{base}/jobs/{job.id}/cancel", token=token.get_attribute("value"))

        def attacker(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [html.encode()]

        with serving(attacker) as elsewhere:
            assert elsewhere.rsplit(":", 1)[0] == base.rsplit(":", 1)[0] and elsewhere != base
            chrome.get(elsewhere + "/")
            assert text_of(chrome, "error-code") == "web.cross_origin_rejected"
            snap(chrome, "cross-origin-refused")
    assert rl.get_job(db, job.id).status is rl.JobStatus.PENDING


def test_pause_and_resume_a_queue_by_clicking(db, chrome):
    rl.configure_queue(db, "mail", global_limit=2, key_limit=1, rate_limit=rl.RateLimit(100, per_seconds=60))
    define(db, "web.mail", queue="mail", max_attempts=3)
    waiting = rl.enqueue(db, "web.mail", {"n": 1}, concurrency_key="customer:42")
    rl.enqueue(db, "web.mail", {"n": 2}, concurrency_key="customer:42")
    rl.enqueue(db, EMAIL, {"n": 3})
    mail_row = 'tr[data-queue="mail"]'
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/")
        chrome.find_element(By.LINK_TEXT, "Queues").click()
        assert chrome.title == "Queues · runledger"
        assert chrome.find_element(By.CSS_SELECTOR, f"{mail_row} td.blocked").text == "1"
        snap(chrome, "queues")

        chrome.find_element(By.CSS_SELECTOR, f"{mail_row} button.pause-queue").click()
        assert text_of(chrome, "done") == "Queue mail paused."
        assert chrome.find_element(By.CSS_SELECTOR, f"{mail_row} td.state").text.startswith("paused since ")
        snap(chrome, "queues-paused")
        assert rl.get_queue(db, "mail").paused and not rl.get_queue(db, "default").paused

        chrome.get(f"{base}/jobs/{waiting.id}")
        assert text_of(chrome, "wait-reason") == "queue_paused"
        snap(chrome, "job-waiting")
        chrome.find_element(By.CSS_SELECTOR, "#job-queue a").click()
        assert text_of(chrome, "chosen") == "Queue mail"
        limit = chrome.find_element(By.CSS_SELECTOR, "#configure input[name=global_limit]")
        limit.clear()
        limit.send_keys("5")
        snap(chrome, "queue-limits")
        chrome.find_element(By.ID, "configure-queue").click()
        assert text_of(chrome, "done") == "Queue mail changed."
        assert rl.get_queue(db, "mail").global_limit == 5

        chrome.find_element(By.CSS_SELECTOR, f"{mail_row} button.resume-queue").click()
        # The page the button is on has a notice too: wait for the next page's.
        WebDriverWait(chrome, 15, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
            lambda d: d.find_element(By.ID, "done").text == "Queue mail resumed.")
        assert chrome.find_element(By.CSS_SELECTOR, f"{mail_row} td.state").text == "active"
        snap(chrome, "queues-resumed")
    assert not rl.get_queue(db, "mail").paused


FLOW = ("flow.fetch", "flow.validate", "flow.render", "flow.send", "flow.archive")


def invoice_run(db) -> rl.WorkflowRunRecord:
    """A run caught midway: steps succeeded, one running, one waiting for an answer, the rest blocked."""
    for job_type in FLOW:
        define(db, job_type, max_attempts=1)
    wf = rl.Workflow("invoice.close", organization_id="acme-1")
    fetch = wf.job("fetch", "flow.fetch", {"invoice": 7}, priority=TOP)
    validate = wf.job("validate", "flow.validate", {"invoice": 7}, after=[fetch], priority=TOP)
    approve = wf.external("approve", after=[validate])
    render = wf.job("render-pdf", "flow.render", {"invoice": 7}, after=[fetch], priority=TOP)
    send = wf.job("send", "flow.send", {"invoice": 7}, after=[approve, render], release="on_success")
    wf.job("archive", "flow.archive", {"invoice": 7}, after=[send])
    run = rl.enqueue_workflow(db, wf)
    finish(db, rl.get_job(db, run.step("fetch").job_id), fail=False)
    run = rl.get_workflow_run(db, run.id)
    finish(db, rl.get_job(db, run.step("validate").job_id), fail=False)
    claim_jobs(db, worker_id="worker-7f3a", lease_ttl_seconds=60, limit=1, job_types=["flow.render"])
    return rl.get_workflow_run(db, run.id)


def test_a_workflow_runs_graph_answered_and_cancelled_by_clicking(db, chrome):
    run = invoice_run(db)
    assert {s.key: s.status.value for s in run.steps} == {
        "fetch": "SUCCEEDED", "validate": "SUCCEEDED", "approve": "WAITING_FOR_EXTERNAL", "render-pdf": "RUNNING",
        "send": "BLOCKED", "archive": "BLOCKED"}
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/workflows")
        chrome.find_element(By.CSS_SELECTOR, "#workflow-runs a").click()
        drawn = [[step.get_attribute("data-step") for step in column.find_elements(By.CSS_SELECTOR, ".step")]
                 for column in WebDriverWait(chrome, 15).until(
                     lambda d: d.find_elements(By.CSS_SELECTOR, "#step-graph .layer"))]
        assert drawn == [["fetch"], ["validate", "render-pdf"], ["approve"], ["send"], ["archive"]]
        edges = {(e.get_attribute("data-source"), e.get_attribute("data-target"))
                 for e in chrome.find_elements(By.CSS_SELECTOR, "#step-graph path.edge")}
        assert edges == {("fetch", "validate"), ("fetch", "render-pdf"), ("validate", "approve"), ("approve", "send"),
                         ("render-pdf", "send"), ("send", "archive")}
        box = chrome.find_element(By.CSS_SELECTOR, '#step-graph [data-step="approve"] rect')
        assert box.value_of_css_property("fill") == "rgb(241, 230, 253)"  # the legend's WAITING_FOR_EXTERNAL
        graph = snap(chrome, "workflow-dag")

        row = chrome.find_element(By.CSS_SELECTOR, 'tr[data-step-row="approve"]')
        row.find_element(By.NAME, "output").send_keys('{"approved_by": "ada"}')
        row.find_element(By.CSS_SELECTOR, "button.answer-succeeded").click()
        assert text_of(chrome, "done") == "The step was answered. (approve)"
        snap(chrome, "workflow-answered")
        chrome.find_element(By.ID, "cancel-run").click()
        WebDriverWait(chrome, 15, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
            lambda d: d.find_element(By.ID, "done").text == "The run was canceled.")
        assert text_of(chrome, "run-status") == "CANCELED"
        snap(chrome, "workflow-canceled")
    after = rl.get_workflow_run(db, run.id)
    assert after.status is rl.WorkflowRunStatus.CANCELED
    assert (after.step("approve").status.value, after.step("approve").output) == ("SUCCEEDED", {"approved_by": "ada"})
    assert after.step("send").status.value == "CANCELED"
    for_the_docs(graph)


def test_a_late_schedule_stands_out_with_its_zones_time(db, chrome):
    define(db, "reports.export", max_attempts=1)
    rl.upsert_schedule(db, "nightly-report", cron_expr="0 0 3 * * *", job_type="reports.export", timezone="Europe/Berlin")
    rl.upsert_schedule(db, "hourly-sync", cron_expr="@hourly", job_type="reports.export")
    with db.begin() as connection:
        connection.execute(text("UPDATE job_schedules SET next_fire_at = now() - interval '2 hours 5 minutes' "
                                "WHERE name = 'nightly-report'"))
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/schedules")
        late = chrome.find_element(By.CSS_SELECTOR, 'tr[data-schedule="nightly-report"]')
        assert "late" in late.get_attribute("class").split()
        assert late.find_element(By.CSS_SELECTOR, ".badge.late").text.startswith("late by 2 h 5 min")
        assert "CE" in late.find_element(By.CSS_SELECTOR, "td.next-fire .zone").text
        assert not chrome.find_elements(By.CSS_SELECTOR, 'tr[data-schedule="hourly-sync"].late')
        assert text_of(chrome, "late-notice").startswith("1 active schedule(s)")
        schedules = snap(chrome, "schedules-late")
    for_the_docs(schedules)


def test_filter_dead_letters_by_code_and_exception_type_then_replay_them_all(db, chrome):
    timeouts = [dead_lettered(db, code="http.timeout", error_type="TimeoutError") for _ in range(3)]
    refused = dead_lettered(db, code="http.timeout", error_type="ConnectionRefusedError")
    declined = dead_lettered(db, code="card.declined")
    with serving(create_app(db, read_only=False, authorize=allow_all)) as base:
        chrome.get(base + "/dead-letters")
        chrome.find_element(By.NAME, "code").send_keys("http.timeout")
        chrome.find_element(By.ID, "filter").click()
        WebDriverWait(chrome, 15).until(lambda d: "code=http.timeout" in d.current_url)
        assert len(chrome.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr")) == 4
        chrome.find_elements(By.CSS_SELECTOR, "a.by-type")[-1].click()  # the oldest row's type: TimeoutError
        WebDriverWait(chrome, 15).until(lambda d: "error_type=TimeoutError" in d.current_url)
        assert len(chrome.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr")) == 3
        assert text_of(chrome, "replayable-count").startswith("3 job(s) matching this filter")
        filtered = snap(chrome, "dead-letters-filtered")
        chrome.find_element(By.ID, "replay-matching").click()
        assert text_of(chrome, "done") == "Requeued 3 job(s)."
        snap(chrome, "dead-letters-filter-replayed")
    assert [rl.get_job(db, j.id).status for j in timeouts] == [rl.JobStatus.PENDING] * 3
    assert [rl.get_job(db, j.id).status for j in (refused, declined)] == [rl.JobStatus.DEAD_LETTERED] * 2
    for_the_docs(filtered)


def test_the_overview_charts_render_with_axes_and_a_legend(db, chrome):
    seed_showcase(db)
    with serving(create_app(db, authorize=allow_all)) as base:
        chrome.get(base + "/?refresh=0")
        charts = chrome.find_elements(By.CSS_SELECTOR, "#charts figure.chart-box")
        assert [chart.get_attribute("id") for chart in charts] == ["chart-throughput", "chart-ready", "chart-wait"]
        for chart in charts:
            svg = chart.find_element(By.CSS_SELECTOR, "svg[role=img]")
            assert svg.size["width"] > 200 and svg.size["height"] > 50  # drawn, not collapsed
            assert svg.find_element(By.TAG_NAME, "title").get_attribute("textContent")
            assert len(svg.find_elements(By.CSS_SELECTOR, ".y-axis text")) >= 2
            assert len(svg.find_elements(By.CSS_SELECTOR, ".x-axis text")) >= 3
            assert chart.find_elements(By.CSS_SELECTOR, ".legend li")
            assert not svg.find_elements(By.CSS_SELECTOR, ".no-data")
        throughput = charts[0]
        assert [item.text for item in throughput.find_elements(By.CSS_SELECTOR, ".legend li")] == [
            "succeeded", "retried", "dead-lettered", "canceled"]
        bars = throughput.find_elements(By.CSS_SELECTOR, "rect.succeeded")
        assert len(bars) > 20 and all(bar.size["height"] > 0 for bar in bars[:5])
        assert chrome.find_elements(By.CSS_SELECTOR, "#chart-ready polyline.line.due")
        chrome.execute_script("document.getElementById('charts').scrollIntoView()")
        snap(chrome, "overview-charts")


def test_live_updates_show_a_jobs_new_status_without_a_reload(db, chrome):
    job = rl.enqueue(db, EMAIL, {"n": 1})
    with serving(create_app(db, authorize=allow_all)) as base:
        chrome.get(f"{base}/jobs/{job.id}")
        chrome.execute_script("window.localStorage.clear()")  # live updates on, whatever an earlier test chose
        chrome.get(f"{base}/jobs/{job.id}")
        toggle = chrome.find_element(By.ID, "live-toggle")
        assert (toggle.text, toggle.get_attribute("aria-pressed")) == ("Live: on", "true")
        assert text_of(chrome, "job-status") == "PENDING"
        chrome.execute_script("window.sameDocument = true")  # gone if the page reloads

        rl.cancel_job(db, job.id)

        WebDriverWait(chrome, 20, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
            lambda d: d.find_element(By.ID, "job-status").text == "CANCELED")
        assert chrome.execute_script("return window.sameDocument") is True
        assert chrome.find_element(By.CSS_SELECTOR, "main").get_attribute("data-live-updated")
        snap(chrome, "job-live-updated")

        toggle.click()
        assert (toggle.text, toggle.get_attribute("aria-pressed")) == ("Live: off", "false")
        chrome.get(f"{base}/jobs")
        assert chrome.find_element(By.ID, "live-toggle").text == "Live: off"  # remembered by this browser
        chrome.find_element(By.ID, "live-toggle").click()
        assert chrome.find_element(By.ID, "live-toggle").text == "Live: on"


def test_live_updates_wait_while_a_form_is_in_use(db, chrome):
    first = rl.enqueue(db, EMAIL, {"n": 1})
    with serving(create_app(db, authorize=allow_all)) as base:
        chrome.get(base + "/jobs")
        chrome.execute_script("window.localStorage.clear()")
        chrome.get(base + "/jobs")
        assert chrome.find_element(By.ID, "live-toggle").text == "Live: on"
        search = chrome.find_element(By.CSS_SELECTOR, "form.filters input[name=q]")
        search.send_keys(str(first.id)[:8])
        assert chrome.find_element(By.ID, "live-toggle").text == "Live: paused"
        later = rl.enqueue(db, EMAIL, {"n": 2})
        main = chrome.find_element(By.CSS_SELECTOR, "main")
        turns = int(main.get_attribute("data-live-turns") or 0)
        WebDriverWait(chrome, 20).until(lambda d: int(main.get_attribute("data-live-turns") or 0) > turns)

        # A turn ran and left the page alone: the typed text is there, the new job is not listed.
        assert search.get_attribute("value") == str(first.id)[:8]
        assert not chrome.find_elements(By.CSS_SELECTOR, f'a[href="/jobs/{later.id}"]')
        assert main.get_attribute("data-live-updated") is None
        snap(chrome, "jobs-live-paused")
