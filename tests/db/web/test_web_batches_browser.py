"""The batch pages in a real headless Chromium (see test_web_browser.py): the bar drawn, the links followed."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import runledger_sync as rl
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import EMAIL, REPORT, TOP, finish, serving
from tests.db.web.test_web_browser import browser, chrome, snap, text_of  # noqa: F401 - the browser fixtures


def test_a_batch_is_followed_from_the_list_to_its_page_and_from_a_member_back_to_it(db, chrome):  # noqa: F811
    batch = rl.open_batch(db, on_success=(REPORT, {"to": "ops"}), on_complete=(REPORT, {}))
    members = [rl.enqueue(db, EMAIL, {"n": n}, priority=TOP, batch=batch.id) for n in range(8)]
    for member in members[:5]:
        finish(db, member, fail=False)
    finish(db, members[5], fail=True)
    rl.close_batch(db, batch.id)
    with serving(create_app(db, authorize=allow_anyone)) as base:
        chrome.get(base + "/")
        chrome.find_element(By.LINK_TEXT, "Batches").click()
        WebDriverWait(chrome, 15).until(lambda d: d.title == "Batches · runledger")
        snap(chrome, "batches")
        chrome.find_element(By.CSS_SELECTOR, f'tr[data-batch="{batch.id}"] a').click()
        assert text_of(chrome, "batch-status") == "CLOSED"
        assert text_of(chrome, "batch-progress") == "6 of 8 members ended (75%)."
        parts = {part.get_attribute("data-part"): part for part in chrome.find_elements(By.CSS_SELECTOR, ".part")}
        assert set(parts) == {"succeeded", "failed", "pending"}
        # Drawn, at their shares of the bar: 5/8, 1/8 and 2/8 of its width.
        widths = {name: part.rect["width"] for name, part in parts.items()}
        bar = chrome.find_element(By.CSS_SELECTOR, "#batch-counts").find_element(By.XPATH, "preceding-sibling::*[1]")
        assert bar.tag_name == "svg"
        assert abs(widths["succeeded"] / bar.rect["width"] - 5 / 8) < 0.02
        assert abs(widths["failed"] / bar.rect["width"] - 1 / 8) < 0.02
        assert parts["succeeded"].value_of_css_property("fill") == "rgb(47, 158, 98)"  # --ok
        snap(chrome, "batch")

        chrome.find_element(By.CSS_SELECTOR, f'tr[data-member="{members[0].id}"] a').click()
        assert text_of(chrome, "job-status") == "SUCCEEDED"
        chrome.find_element(By.CSS_SELECTOR, "#job-batch a").click()
        WebDriverWait(chrome, 15).until(lambda d: d.find_element(By.ID, "batch-status"))
        assert chrome.current_url.endswith(f"/batches?batch={batch.id}")
