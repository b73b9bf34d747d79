"""Run again in a real headless Chromium: a reason typed, the replay recorded with the hook's user, a resubmit replaying once."""

from __future__ import annotations

from selenium.webdriver.common.by import By

import runledger_sync as rl
from runledger_sync.web import create_app
from tests.db.web.conftest import dead_lettered, serving
from tests.db.web.test_web_browser import browser, chrome, snap, text_of  # noqa: F401  browser and chrome are fixtures
from tests.support import event_types


def test_run_again_by_clicking_records_the_replay_and_a_resubmit_queues_nothing_more(db, chrome):  # noqa: F811
    job = dead_lettered(db)
    with serving(create_app(db, read_only=False, authorize=lambda request, action: "alice")) as base:
        chrome.get(f"{base}/jobs/{job.id}")
        assert not chrome.find_elements(By.ID, "replays")
        chrome.find_element(By.ID, "replay-reason").send_keys("the mailbox is fixed")
        snap(chrome, "job-replay-form")
        drawn = chrome.find_element(By.ID, "replay-form").get_attribute("outerHTML")
        chrome.find_element(By.ID, "retry-job").click()
        assert text_of(chrome, "done").startswith("The job was queued again as a new run")
        rows = chrome.find_elements(By.CSS_SELECTOR, "#replays tbody tr")
        assert len(rows) == 1
        cells = [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")]
        assert cells[1:3] == ["alice", "the mailbox is fixed"] and cells[4:] == ["DEAD_LETTERED, run 1", "2"]
        chrome.execute_script("arguments[0].scrollIntoView(); window.scrollBy(0, -60);", chrome.find_element(By.ID, "replays"))
        snap(chrome, "job-replays")

        # The form as it was drawn, sent again (a second tab still showing it, a double click).
        chrome.execute_script("document.querySelector('main').insertAdjacentHTML('beforeend', arguments[0]);", drawn)
        chrome.find_element(By.ID, "replay-reason").send_keys("the mailbox is fixed")
        chrome.find_element(By.ID, "retry-job").click()
        assert "nothing more was queued" in text_of(chrome, "done")
    assert rl.get_job(db, job.id).run_number == 2
    assert event_types(db, job.id).count("REQUEUED") == 1 and len(rl.list_replays(db)) == 1
