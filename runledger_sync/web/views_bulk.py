"""Bulk actions over the jobs list's filter (a confirmation page with the dry-run count, then the action) and the operations page.

Every bulk action takes two requests: a GET draws the confirmation page, which
counts what the action would take with ``dry_run=True`` (nothing changes, nothing
is recorded) and says the filter in words; only that page's POST acts. The filter
travels as the jobs list's own query values (``status``, ``type``, ``org``,
``meta``), so the page confirms exactly what the list showed.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Callable, Optional
from uuid import UUID

import runledger_sync as rl
from runledger_sync.core.bulk import JobUpdate
from runledger_sync.core.bulk_errors import InvalidJobUpdate
from runledger_sync.web.http import PageHost, Request, Response
from runledger_sync.web.views_jobs import BULK_BUTTONS, meta_filter

#: The URL's action (what the authorize hook is asked about) -> the API call it makes.
BULK_ACTIONS: dict[str, Callable[..., rl.BulkResult]] = {
    "bulk_cancel": rl.cancel_jobs,
    "bulk_retry": rl.retry_jobs,
    "bulk_delete": rl.delete_jobs,
    "bulk_update": rl.update_jobs,
}
#: The jobs list's filter fields a bulk action carries, as the list's query names them.
FILTER_FIELDS = ("status", "type", "org", "meta")
#: Operations listed, and looked through for one a resubmitted confirmation already started.
OPERATIONS_PAGE = 100


def bulk_statuses(action: str) -> tuple[str, ...]:
    """The statuses a bulk action takes, as the jobs list's buttons know them."""
    return next(statuses for name, _, statuses in BULK_BUTTONS if name == action)


def _filter_of(dashboard: PageHost, request: Request, read: Callable[[str], Optional[str]], action: str) -> rl.JobFilter:
    """The jobs list's filter as a JobFilter; one naming nothing the operator chose is refused, scope or not."""
    search = read("q")
    if search is not None:
        raise rl.InvalidJobFilter("q", search, "empty for a bulk action, which takes the type, status, "
                                               "organization and metadata filters (clear the id or key search)")
    status, job_type, meta = read("status"), read("type"), read("meta")
    scope = dashboard.organization(request)
    chosen = rl.JobFilter(statuses=[status] if status else None, job_types=[job_type] if job_type else None,
                          organization_id=read("org") if scope is None else None, meta=meta_filter(meta))
    # A scoped dashboard's organization is not the operator's choice: it alone would choose every job they see.
    chosen.require_criteria(action.removeprefix("bulk_"))
    return chosen if scope is None else dataclasses.replace(chosen, organization_id=scope)


def _changes_of(read: Callable[[str], Optional[str]]) -> dict[str, Any]:
    """What a bulk update sets, from the form: ``priority`` and ``run_at`` (a datetime-local box, read as UTC)."""
    changes: dict[str, Any] = {}
    priority, run_at = read("priority"), read("run_at")
    if priority is not None:
        try:
            changes["priority"] = int(priority)
        except ValueError:
            raise InvalidJobUpdate("priority", priority, "an integer") from None
    if run_at is not None:
        try:
            moment = datetime.fromisoformat(run_at)
        except ValueError:
            raise InvalidJobUpdate("run_at", run_at, "a date and time (2026-12-06T18:00)") from None
        changes["run_at"] = moment if moment.utcoffset() is not None else moment.replace(tzinfo=timezone.utc)
    return changes


def bulk_confirm(dashboard: PageHost, request: Request, action: str) -> Response:
    """The confirmation page: the filter in words and the dry-run count; its form is what acts."""
    dashboard.require_action(request, action)
    chosen = _filter_of(dashboard, request, request.arg, action)
    changes = _changes_of(request.arg) if action == "bulk_update" else {}
    counted: Optional[rl.BulkResult] = None
    # An update's count is taken with what it sets (its rule is checked with the count); until
    # then the page asks for the values.
    if action != "bulk_update" or changes:
        counted = BULK_ACTIONS[action](dashboard.engine, chosen, reason="confirmation count", dry_run=True, **changes)
    return dashboard.render(
        request, "bulk_confirm.html", action=action, verb=action.removeprefix("bulk_"), chosen=chosen,
        counted=counted, changes=changes, statuses=bulk_statuses(action),
        carried={name: request.arg(name) for name in FILTER_FIELDS},
        run_at_value=request.arg("run_at") or "", priority_value=request.arg("priority") or "",
        drawn_at=datetime.now(timezone.utc).isoformat(),
    )


def bulk_act(dashboard: PageHost, request: Request, action: str) -> Response:
    """The confirmation's POST: act once, then show the operation on the operations page."""
    chosen = _filter_of(dashboard, request, request.form, action)
    changes = _changes_of(request.form) if action == "bulk_update" else {}
    reason, actor = request.form("reason") or "", request.user or None
    earlier = _already_acted(dashboard, request, action, chosen, changes, reason, actor)
    if earlier is not None:
        return Response.redirect(request.url("/operations", done=str(earlier.id), again="1"))
    result = BULK_ACTIONS[action](dashboard.engine, chosen, reason=reason, actor=actor, **changes)
    return Response.redirect(request.url("/operations", done=str(result.operation_id)))


def _already_acted(dashboard: PageHost, request: Request, action: str, chosen: rl.JobFilter, changes: dict[str, Any],
                   reason: str, actor: Optional[str]) -> Optional[rl.JobOperation]:
    """The operation this very confirmation started already, when it is sent again (a double click, a resubmit).

    Sent again, the action would find its jobs done (a second cancel changes none), but
    a retried job that finished meanwhile would run a third time: the page drawn once acts once.
    """
    try:
        drawn_at = datetime.fromisoformat(request.form("drawn_at") or "")
    except ValueError:
        return None
    if drawn_at.utcoffset() is None:
        return None
    recorded_changes = JobUpdate(**changes).to_json() if changes else {}
    for operation in rl.list_operations(dashboard.engine, limit=OPERATIONS_PAGE):
        if operation.started_at < drawn_at:
            break  # newest first: the rest began before the page was drawn
        if (operation.action, operation.reason, operation.filter, operation.changes) == (
                action.removeprefix("bulk_"), reason, chosen.to_json(), recorded_changes) \
                and (actor is None or operation.actor == actor):
            return operation
    return None


def operations(dashboard: PageHost, request: Request) -> Response:
    """Every bulk action recorded, newest first; a scoped dashboard shows its organization's only."""
    scope = dashboard.organization(request)
    listed = [operation for operation in rl.list_operations(dashboard.engine, limit=OPERATIONS_PAGE)
              if scope is None or operation.filter.get("organization_id") == scope]
    done = _operation_named(listed, request.arg("done"))
    return dashboard.render(request, "operations.html", operations=listed, done=done,
                            again=request.arg("again") == "1")


def _operation_named(listed: list[rl.JobOperation], wanted: Optional[str]) -> Optional[rl.JobOperation]:
    try:
        wanted_id = UUID(wanted or "")
    except ValueError:
        return None
    return next((operation for operation in listed if operation.id == wanted_id), None)
