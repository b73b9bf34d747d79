"""A queue that looks lived-in, for the browser tests' screenshots: several types, an hour of finished work, failures, busy workers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure, complete_job_success
from runledger_sync.store.admin.rollup import SETTLE_SECONDS, sample_rollup
from tests.support import define

TYPES = {"email.send": 120, "reports.export": 30, "billing.charge": 60, "webhooks.deliver": 90}
#: Every n-th finished job of a type fails: (n, error code, terminal?).
FAILING = {
    "billing.charge": (7, "card.declined", True),
    "webhooks.deliver": (5, "http.timeout", False),
    "reports.export": (11, "storage.unavailable", False),
}


@dataclass(frozen=True)
class Showcase:
    idempotency_key: str
    payload_marker: str


def _finish_all(db: Any, job_type: str, count: int) -> None:
    every, code, terminal = FAILING.get(job_type, (0, "", False))
    claimed = claim_jobs(db, worker_id=f"worker-{len(job_type)}", lease_ttl_seconds=60, limit=count, job_types=[job_type])
    for index, job in enumerate(claimed, start=1):
        identity = LeaseIdentity.of(job).keywords()
        if every and index % every == 0:
            failure = (rl.JobFailure.terminal if terminal else rl.JobFailure.retryable)(code, f"{code} on attempt {job.attempt}")
            complete_job_failure(db, **identity, failure=failure, retry_delay_ms=600_000)
        else:
            complete_job_success(db, **identity, completion=rl.JobCompletion.success().with_output({"ok": True}))


def _spread_over_the_last_hour(db: Any) -> None:
    # Rows written within a second would draw one bar: move each finished event back
    # by a deterministic number of minutes so the chart shows an hour of traffic.
    with db.begin() as conn:
        conn.execute(text(
            "UPDATE job_events SET occurred_at = now() - make_interval(mins => ((id * 37) % 58)::int, secs => (id % 50)::int) "
            "WHERE event_type IN ('SUCCEEDED', 'FAILED', 'RETRY_SCHEDULED', 'DEAD_LETTERED')"
        ))
        conn.execute(text("UPDATE job_queue SET created_at = now() - make_interval(mins => (abs(hashtext(id::text)) % 59)::int)"))


def _sample_the_last_hour(db: Any) -> None:
    """Run the sampler for each minute of the last hour, as a worker would have, minute by minute."""
    with db.connect() as conn:
        last = conn.execute(text("SELECT date_trunc('minute', now()) - interval '1 minute'")).scalar_one()
    for back in range(59, -1, -1):
        minute = last - timedelta(minutes=back)
        sample_rollup(db, now=minute + timedelta(minutes=1, seconds=SETTLE_SECONDS))
    # The jobs waiting now were enqueued a moment ago, so the past minutes sampled none
    # due: give them a deterministic backlog that builds up and drains.
    with db.begin() as conn:
        conn.execute(text(
            "UPDATE job_rollup_minutes SET ready = (abs(30 - (extract(epoch FROM minute)::bigint / 60) % 60) * 3)::int, "
            "oldest_due_wait_seconds = abs(30 - (extract(epoch FROM minute)::bigint / 60) % 60) * 1.7 "
            "WHERE queue = 'default'"))


def seed_showcase(db: Any) -> Showcase:
    """Fill the queue with a realistic mix; return what identifies one dead-lettered job."""
    for job_type in TYPES:
        define(db, job_type, max_attempts=3)
    for job_type, count in TYPES.items():
        rl.enqueue_many(db, [rl.JobSpec(job_type, {"n": n}, organization_id=f"acme-{n % 3}") for n in range(count)])
        _finish_all(db, job_type, count - 6)
    marker = "4111-xxxx-xxxx-1111"
    key = "invoice-2026-1207"
    job = rl.enqueue(db, "billing.charge", {"invoice": key, "card": marker, "amount_cents": 129900},
                     idempotency_key=key, organization_id="acme-1", priority=1_000_000)
    claimed = claim_jobs(db, worker_id="worker-7f3a", lease_ttl_seconds=60, limit=1, job_types=["billing.charge"])
    assert [c.id for c in claimed] == [job.id]
    complete_job_failure(db, **LeaseIdentity.of(claimed[0]).keywords(),
                         failure=rl.JobFailure.terminal("card.declined", "issuer said: do not honor"), retry_delay_ms=None)
    claim_jobs(db, worker_id="worker-7f3a", lease_ttl_seconds=60, limit=3, job_types=["email.send"])
    claim_jobs(db, worker_id="worker-b21c", lease_ttl_seconds=60, limit=2, job_types=["webhooks.deliver"])
    rl.upsert_schedule(db, "nightly-report", cron_expr="0 0 3 * * *", job_type="reports.export", payload_template={})
    order = rl.Workflow("order.fulfil", idempotency_key="order-42", organization_id="acme-1")
    charge = order.job("charge", "billing.charge", {"order": 42})
    receipt = order.job("receipt", "email.send", {"order": 42}, after=[charge], release="on_success")
    approval = order.external("approval", after=[charge])
    order.job("deliver", "webhooks.deliver", {"order": 42}, after=[receipt, approval])
    rl.enqueue_workflow(db, order)
    _spread_over_the_last_hour(db)
    _sample_the_last_hour(db)
    return Showcase(idempotency_key=key, payload_marker=marker)
