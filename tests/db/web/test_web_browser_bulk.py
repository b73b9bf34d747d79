"""Bulk cancel in a real headless Chromium: filter the list by metadata, confirm the counted jobs, land on the operations page."""

from __future__ import annotations

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import EMAIL, REPORT, serving
from tests.db.web.test_web_browser import browser, chrome, for_the_docs, snap, text_of  # noqa: F401  fixtures


def test_bulk_cancel_by_metadata_confirms_the_count_and_lands_on_the_operations_page(db, chrome):  # noqa: F811
    acme = [rl.enqueue(db, EMAIL, {"n": n}, meta={"tenant": "acme", "region": "eu"}) for n in range(4)]
    rl.enqueue(db, REPORT, {"n": 9}, meta={"tenant": "acme", "region": "us"})
    other = rl.enqueue(db, EMAIL, {"n": 10}, meta={"tenant": "globex", "region": "eu"})
    with serving(create_app(db, read_only=False, authorize=lambda request, action: "alice")) as base:
        chrome.get(f"{base}/jobs")
        chrome.find_element(By.NAME, "meta").send_keys("tenant=acme, region=eu")
        chrome.find_element(By.CSS_SELECTOR, "form.filters button").click()
        # The filtered page replaces the whole list once it loads: wait for it, not for the click.
        WebDriverWait(chrome, 15, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: "meta=" in d.current_url and len(d.find_elements(By.CSS_SELECTOR, "#jobs a.job-link")) == 4)
        listed = snap(chrome, "jobs-bulk-actions")
        chrome.find_element(By.ID, "bulk_cancel").click()

        assert text_of(chrome, "dry-run-count") == "4"
        assert "tenant=acme" in text_of(chrome, "filter-words") and "region=eu" in text_of(chrome, "filter-words")
        assert {job.status for job in rl.list_jobs(db)} == {rl.JobStatus.PENDING}  # the count changed nothing
        chrome.find_element(By.ID, "bulk-reason").send_keys("tenant acme offboarded in the EU")
        confirm = snap(chrome, "jobs-bulk-confirm")
        chrome.find_element(By.ID, "bulk-submit").click()

        assert text_of(chrome, "done").startswith("Cancel by alice: 4 matched, 4 changed")
        assert chrome.title == "Operations · runledger"
        [operation] = rl.list_operations(db)
        cells = [cell.text for cell in chrome.find_elements(By.CSS_SELECTOR, f"#operation-{operation.id} td")]
        assert cells[2:5] == ["alice", "cancel", "tenant acme offboarded in the EU"] and cells[6:8] == ["4", "4"]
        operations = snap(chrome, "operations")
    assert [rl.get_job(db, job.id).status for job in acme] == [rl.JobStatus.CANCELED] * 4
    assert rl.get_job(db, other.id).status is rl.JobStatus.PENDING
    assert operation.actor == "alice" and operation.filter == {"meta": {"tenant": "acme", "region": "eu"}}
    for_the_docs(listed, confirm, operations)
