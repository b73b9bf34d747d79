"""The jobs list (filters, keyset pages), one job's page with its replays, and its cancel, retry and replay actions."""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.store.admin.bulk import ACTION_STATUSES
from runledger_sync.web.http import PageHost, Request, Response

PAGE_SIZE = 50
#: The most characters of a stored value (payload, output, checkpoint) a job page draws: outputs
#: may be megabytes, which no browser page should carry. ``rl.get_job`` gives the whole value.
SHOWN_VALUE_CHARS = 20_000
#: What the operator is told after an action, by the ``done`` query value (never echoed as given).
DONE_MESSAGES = {
    "canceled": "The job was canceled.",
    "retried": "The job was queued again as a new run.",
    "replayed": "The job was queued again as a new run; the replay is recorded below.",
    "already_replayed": "This replay was already recorded (the form was sent twice); nothing more was queued.",
}

#: The jobs list's bulk actions: (action, button label, the statuses it takes; its button is drawn for those or none).
BULK_BUTTONS = tuple(
    (f"bulk_{action}", label, tuple(status.value for status in ACTION_STATUSES[action]))
    for action, label in (("cancel", "Cancel"), ("retry", "Retry"), ("delete", "Delete"),
                          ("update", "Change priority or time"))
)


def jobs_list(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    filters = {
        "status": request.arg("status"),
        "job_type": request.arg("type"),
        # A scoped dashboard shows its own organization whatever the query asks.
        "organization_id": scope if scope is not None else request.arg("org"),
        "search": request.arg("q"),
        "meta": request.arg("meta"),
    }
    before = _page_cursor(dashboard, request.arg("before"), filters["organization_id"])
    jobs = rl.list_jobs(
        dashboard.engine, status=filters["status"], job_type=filters["job_type"],
        organization_id=filters["organization_id"], search=filters["search"], before=before, limit=PAGE_SIZE + 1,
        meta=meta_filter(filters["meta"]),
    )
    next_before = str(jobs[PAGE_SIZE - 1].id) if len(jobs) > PAGE_SIZE else None
    return dashboard.render(
        request, "jobs.html", jobs=jobs[:PAGE_SIZE], filters=filters, next_before=next_before,
        statuses=[status.value for status in rl.JobStatus], paged=before is not None, bulk_actions=BULK_BUTTONS,
    )


def meta_filter(text: Optional[str]) -> Optional[dict[str, str]]:
    """The metadata box, ``tenant=acme, region=eu``, as the mapping ``list_jobs(meta=)`` takes."""
    if text is None or not text.strip():
        return None
    meta: dict[str, str] = {}
    for pair in text.split(","):
        key, equals, value = pair.partition("=")
        if not equals or key.strip() in meta:
            raise rl.InvalidMeta("meta", None, "KEY=VALUE pairs separated by commas, each key once",
                                 got=f"{len(text)} characters of text")
        meta[key.strip()] = value.strip()
    return meta


def _page_cursor(dashboard: PageHost, before_id: Optional[str], organization_id: Optional[str]) -> Any:
    """The job a page starts after: the list continues below its (created_at, id)."""
    if before_id is None:
        return None
    job = rl.get_job(dashboard.engine, before_id, organization_id=organization_id)
    if job is None:
        raise rl.JobNotFound(f"the page cursor {before_id} names no job; start from the first page")
    return job


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _shown(value: Any) -> Optional[tuple[str, int]]:
    """A stored value as the page draws it: its first characters, and how many were left out."""
    if value is None:
        return None
    text = _pretty(value)
    return text[:SHOWN_VALUE_CHARS], max(0, len(text) - SHOWN_VALUE_CHARS)


def _wait_of(dashboard: PageHost, job: rl.JobRecord, scope: Optional[str]) -> Optional[rl.JobWait]:
    """Why a PENDING job waits; a blocking job this dashboard may not show is not named."""
    if job.status is not rl.JobStatus.PENDING:
        return None
    wait = rl.explain_wait(dashboard.engine, job.id)  # None: claimed since it was read
    blocker = wait.blocking_job_id if wait is not None else None
    if wait is None or blocker is None or scope is None:
        return wait
    if rl.get_job(dashboard.engine, blocker, organization_id=scope) is not None:
        return wait
    # A key is shared across organizations: say it is busy without naming another organization's job.
    return rl.JobWait(wait.reason, f"concurrency key {job.concurrency_key!r} is busy: a job of another "
                                   "organization holds its turn", until=wait.until)


def job_page(dashboard: PageHost, request: Request, job_id: str) -> Response:
    scope = dashboard.organization(request)
    job = rl.get_job(dashboard.engine, job_id, organization_id=scope)
    if job is None:
        raise rl.JobNotFound(f"job {job_id} was not found")
    # The payload may hold personal data: it is sent only when asked for, never hidden by CSS.
    show_payload = request.arg("payload") == "1"
    attempts, events = rl.list_attempts(dashboard.engine, job.id), rl.list_events(dashboard.engine, job.id)
    return dashboard.render(
        request, "job.html", job=job,
        attempts=attempts,
        events=[(event, _pretty(event.payload) if event.payload else "") for event in events],
        retries=rl.retry_summary(job, attempts, events),
        dead_letter=rl.get_dead_letter(dashboard.engine, job.id),
        output=_shown(job.output),
        checkpoint=_shown(job.checkpoint),
        payload=_shown(job.payload) if show_payload else None,
        done=DONE_MESSAGES.get(request.arg("done") or ""),
        cancelable=not job.status.is_terminal,
        wait=_wait_of(dashboard, job, scope),
        replays=rl.list_replays(dashboard.engine, job.id),
        # One key per form drawn: the same form sent twice (a double click, a resubmit) replays once.
        replay_key=uuid.uuid4().hex,
    )


def job_action(dashboard: PageHost, request: Request, job_id: str, action: str) -> Response:
    scope = dashboard.organization(request)
    if action == "cancel":
        rl.cancel_job(dashboard.engine, job_id, reason="CANCELED_FROM_DASHBOARD", organization_id=scope)
        done = "canceled"
    elif action == "replay_job":
        if rl.get_job(dashboard.engine, job_id, organization_id=scope) is None:
            raise rl.JobNotFound(f"job {job_id} was not found")
        replay = rl.replay_job(dashboard.engine, job_id, replay_key=request.form("replay_key") or "",
                               reason=request.form("reason") or "", actor=request.user or None, **_seen(request))
        done = "replayed" if replay.disposition == "created" else "already_replayed"
    else:
        rl.requeue_job(dashboard.engine, job_id, reason="RETRIED_FROM_DASHBOARD", organization_id=scope,
                       **_seen(request))
        done = "retried"
    return Response.redirect(request.url(f"/jobs/{job_id}", done=done))


def _seen(request: Request) -> dict[str, Any]:
    """The status and run the page showed: a job another operator ran again meanwhile is not run twice."""
    seen_run = request.form("seen_run") or None
    if seen_run is not None and not seen_run.isdigit():
        raise rl.errors.InvalidArgument("seen_run", seen_run, "the run number the page showed")
    return {"expected_status": request.form("seen_status") or None,
            "expected_run_number": None if seen_run is None else int(seen_run)}
