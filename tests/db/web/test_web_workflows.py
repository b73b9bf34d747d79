"""The dashboard's workflow page for large runs: every step reachable, no page of megabytes."""

from __future__ import annotations

import re

import runledger_sync as rl
from tests.db.web.conftest import page


def test_a_chain_of_thousands_of_steps_is_drawn_a_page_of_steps_at_a_time(db, client):
    wf = rl.Workflow("chain")
    for index in range(5_000):
        wf.external(f"s{index}", after=[f"s{index - 1}"] if index else ())
    run = rl.enqueue_workflow(db, wf)

    first = page(client, f"/workflows?run={run.id}")
    assert len(first) < 300_000
    shown = re.findall(r'data-step="(s\d+)"', first)
    assert shown[:2] == ["s0", "s1"] and 0 < len(shown) < 5_000
    assert "5000 steps" in first
    following = re.search(r'href="(/workflows\?run=[^"]+&amp;page=2)"', first)
    assert following is not None

    last_page = -(-5_000 // len(shown))
    last = page(client, f"/workflows?run={run.id}&page={last_page}")
    assert re.findall(r'data-step="(s\d+)"', last)[-1] == "s4999"
    assert 'page=2"' not in last or last_page == 2


def test_a_bad_page_number_is_refused_and_one_past_the_end_shows_the_last_page(db, client):
    wf = rl.Workflow("small")
    wf.external("only")
    run = rl.enqueue_workflow(db, wf)
    assert "job.invalid_argument" in page(client, f"/workflows?run={run.id}&page=zero", status=400)
    assert "job.invalid_argument" in page(client, f"/workflows?run={run.id}&page=0", status=400)
    assert 'data-step="only"' in page(client, f"/workflows?run={run.id}&page=7")
