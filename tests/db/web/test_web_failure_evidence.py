"""The job and dead-letter pages show a failed attempt's exception type and traceback, escaped."""

from __future__ import annotations

import runledger_sync as rl
from runledger_sync.core.evidence import CALLED_BY_HEADING
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure
from tests.db.web.conftest import EMAIL, HOSTILE, TOP, page


def dead_lettered_with_evidence(db, error_type: str, traceback: str) -> rl.JobRecord:
    job = rl.enqueue(db, EMAIL, {"n": 1}, priority=TOP)
    [claimed] = claim_jobs(db, worker_id="web-worker", lease_ttl_seconds=60, limit=1, job_types=[EMAIL])
    complete_job_failure(db, **LeaseIdentity.of(claimed).keywords(), retry_delay_ms=None,
                         failure=rl.JobFailure.panicked("job.handler_panic", "Job handler panicked: 'x'"),
                         error_type=error_type, traceback=traceback)
    return job


def test_both_pages_show_the_type_and_the_folded_traceback(db, client):
    job = dead_lettered_with_evidence(db, "myapp.billing.Declined",
                                      'Traceback (most recent call last):\n  File "app.py", line 9, in charge\n'
                                      "myapp.billing.Declined: card declined\n")

    for url, shown in ((f"/jobs/{job.id}", '<div class="error-type"><code>myapp.billing.Declined</code></div>'),
                       ("/dead-letters", "<code>myapp.billing.Declined</code></a></td>")):
        html = page(client, url)
        assert shown in html, url
        assert '<details class="traceback"><summary>Traceback</summary><pre>Traceback (most recent call last):' in html
        assert "in charge" in html
    assert 'id="dead-letter-error-type">myapp.billing.Declined</code>' in page(client, f"/jobs/{job.id}")


def test_a_hostile_type_and_traceback_are_escaped(db, client):
    job = dead_lettered_with_evidence(db, HOSTILE, f"Traceback (most recent call last):\n{HOSTILE}\n")

    for url in (f"/jobs/{job.id}", "/dead-letters"):
        html = page(client, url)
        assert "<script>alert" not in html and "<img src=x" not in html, url
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html.split('class="traceback"', 1)[1]


def test_both_pages_show_the_handlers_frames_first_and_fold_the_frames_that_called_it(db, client):
    job = dead_lettered_with_evidence(db, "KeyError", (
        'Traceback (most recent call last):\n  File "app.py", line 9, in charge\nKeyError: \'card\'\n\n'
        f'{CALLED_BY_HEADING}  File "runledger_sync/runtime/attempt/run.py", line 254, in _run_handler\n'))

    for url in (f"/jobs/{job.id}", "/dead-letters"):
        assert ('<details class="traceback"><summary>Traceback</summary><pre>Traceback (most recent call last):\n'
                '  File &#34;app.py&#34;, line 9, in charge\nKeyError: &#39;card&#39;\n</pre>'
                f'<details class="called-by"><summary>{CALLED_BY_HEADING.strip()}</summary>'
                '<pre>  File &#34;runledger_sync/runtime/attempt/run.py&#34;, line 254, in _run_handler\n</pre></details>'
                '</details>') in page(client, url), url
