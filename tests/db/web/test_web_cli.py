"""``runledger-sync dashboard`` serves the app over real HTTP until SIGTERM."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

import runledger_sync as rl
from tests.db.web.conftest import EMAIL, dashboard_process, dead_lettered


def fetch(url: str, data: dict | None = None) -> tuple[int, str]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    try:
        with urllib.request.urlopen(url, data=body, timeout=30) as response:  # noqa: S310 - http://127.0.0.1 only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_dashboard_command_serves_pages_read_only_and_stops_on_sigterm(db, fresh_database):
    job = dead_lettered(db)
    with dashboard_process(fresh_database) as base:
        status, html = fetch(base + "/")
        assert status == 200 and 'id="count-dead_lettered">1<' in html
        status, html = fetch(f"{base}/jobs/{job.id}")
        assert status == 200 and 'id="job-status">DEAD_LETTERED<' in html
        status, html = fetch(base + "/dead-letters/replay", {"job_id": str(job.id)})
        assert status == 403 and "web.read_only" in html
    assert rl.get_job(db, job.id).status is rl.JobStatus.DEAD_LETTERED


def test_dashboard_command_scopes_to_an_organization(db, fresh_database):
    mine = rl.enqueue(db, EMAIL, {"n": 1}, organization_id="org-a")
    theirs = rl.enqueue(db, EMAIL, {"n": 2}, organization_id="org-b")
    with dashboard_process(fresh_database, "--org", "org-a", "--allow-actions") as base:
        status, html = fetch(base + "/jobs")
        assert status == 200 and str(mine.id) in html and str(theirs.id) not in html
        assert "organization org-a · actions enabled" in html
