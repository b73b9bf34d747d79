"""The dashboard's batches: the list, a batch's page with its counts and progress bar, the link from a member's page."""

from __future__ import annotations

import re

import runledger_sync as rl
from runledger_sync.web import allow_anyone, create_app
from tests.db.web.conftest import EMAIL, HOSTILE, REPORT, TOP, Browser, finish, page


def batch_of_four(db) -> tuple[rl.BatchRecord, list[rl.JobRecord]]:
    """Four e-mails: two sent, one bounced, one still waiting; the batch closed."""
    batch = rl.open_batch(db, on_success=(REPORT, {}), on_complete=(REPORT, {"note": HOSTILE}), meta={"by": HOSTILE})
    members = [rl.enqueue(db, EMAIL, {"n": n}, priority=TOP, batch=batch.id) for n in range(4)]
    finish(db, members[0], fail=False)
    finish(db, members[1], fail=False)
    finish(db, members[2], fail=True)
    rl.close_batch(db, batch.id)
    return batch, members


def bar_parts(html: str) -> dict[str, float]:
    return {name: float(width) for name, width in re.findall(r'data-part="(\w+)" x="[\d.]+" y="0" width="([\d.]+)"', html)}


def test_the_batches_list_shows_each_batch_with_its_status_and_progress(db, client):
    batch, _ = batch_of_four(db)
    empty = rl.open_batch(db)
    html = page(client, "/batches")
    assert html.index(f'data-batch="{empty.id}"') < html.index(f'data-batch="{batch.id}"')  # newest first
    row = html[html.index(f'data-batch="{batch.id}"'):]
    row = row[:row.index("</tr>")]
    assert "CLOSED" in row and "3/4 ended, 1 failed" in row
    assert bar_parts(row) == {"succeeded": 50.0, "failed": 25.0, "pending": 25.0}
    assert f'href="/batches?batch={batch.id}"' in html
    assert '<a href="/batches">Batches</a>' in html


def test_a_batch_page_shows_counts_bar_callbacks_and_members_and_updates_as_the_last_ends(db, client):
    batch, members = batch_of_four(db)
    html = page(client, f"/batches?batch={batch.id}")
    assert re.search(r'id="batch-status">CLOSED<', html)
    assert "3 of 4 members ended (75%)" in html
    for name, count in (("pending", 1), ("succeeded", 2), ("failed", 1), ("canceled", 0)):
        assert re.search(rf'id="count-{name}">{count}<', html)
    assert set(re.findall(r'data-member="([^"]+)"', html)) == {str(m.id) for m in members}
    assert HOSTILE not in html and "&lt;script&gt;" in html

    finish(db, members[3], fail=False)
    html = page(client, f"/batches?batch={batch.id}")
    done = rl.get_batch(db, batch.id)
    assert re.search(r'id="batch-status">COMPLETED_WITH_ERRORS<', html)
    assert bar_parts(html) == {"succeeded": 75.0, "failed": 25.0}
    assert done.on_success_job_id is None and f'href="/jobs/{done.on_complete_job_id}"' in html


def test_a_members_job_page_links_to_its_batch(db, client):
    batch, members = batch_of_four(db)
    html = page(client, f"/jobs/{members[0].id}")
    assert re.search(rf'id="job-batch"><a href="/batches\?batch={batch.id}">', html)
    plain = rl.enqueue(db, EMAIL, {"plain": True})
    assert 'id="job-batch"' not in page(client, f"/jobs/{plain.id}")


def test_an_unknown_batch_is_not_found_and_a_scoped_dashboard_shows_no_batch(db, client):
    batch, _ = batch_of_four(db)
    assert "batch.not_found" in page(client, "/batches?batch=0190c6c2-5f1e-7000-8000-000000000000", status=404)
    assert "job.invalid_argument" in page(client, "/batches?batch=nope", status=400)
    scoped = Browser(create_app(db, authorize=allow_anyone, organization_id="org-a"))
    assert f'data-batch="{batch.id}"' not in page(scoped, "/batches")
    assert "batch.not_found" in page(scoped, f"/batches?batch={batch.id}", status=404)


def test_a_batch_page_lists_its_member_runs_linked_to_their_workflow_page(db, client):
    batch = rl.open_batch(db)
    wf = rl.Workflow("web.flow")
    wf.job("only", EMAIL)
    run = rl.enqueue_workflow(db, wf, batch=batch.id)
    html = page(client, f"/batches?batch={batch.id}")
    assert re.findall(r'data-run="([^"]+)"', html) == [str(run.id)]
    assert f'href="/workflows?run={run.id}"' in html and "web.flow" in html
    assert 'data-member="' not in html
