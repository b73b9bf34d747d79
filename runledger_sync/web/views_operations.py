"""Dead letters (replay one or many) and schedules (pause, resume, trigger)."""

from __future__ import annotations

import re
from typing import Optional

import runledger_sync as rl
from runledger_sync.store.admin import job_statuses
from runledger_sync.web.http import PageHost, Request, Response

DEAD_LETTER_PAGE = 100
#: The most jobs one bulk replay requeues: one page of the list.
REPLAY_LIMIT = DEAD_LETTER_PAGE
REPLAY_REASON = "DEAD_LETTER_REPLAY"
SCHEDULE_DONE = {"pause": "paused", "resume": "resumed", "trigger": "triggered"}


def dead_letters(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    organization_id = scope if scope is not None else request.arg("org")
    job_type = request.arg("type")
    letters = rl.list_dead_letters(dashboard.engine, job_type=job_type, organization_id=organization_id,
                                   limit=DEAD_LETTER_PAGE)
    # A dead-letter row outlives a replay; the job's status tells whether it is still dead.
    statuses = job_statuses(dashboard.engine, [letter.job_id for letter in letters], organization_id=organization_id)
    rows = [(letter, statuses.get(letter.job_id) is rl.JobStatus.DEAD_LETTERED) for letter in letters]
    return dashboard.render(
        request, "dead_letters.html", rows=rows, job_type=job_type, organization_id=organization_id,
        replayed=_count_arg(request, "replayed"),
    )


def _count_arg(request: Request, name: str) -> Optional[int]:
    """A small count from the query; ASCII digits only (str.isdigit() also takes '²', which int() refuses)."""
    value = request.arg(name)
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]{1,6}", value):
        raise rl.InvalidArgument(name, value, "a count of jobs (digits, at most 6)")
    return int(value)


def replay(dashboard: PageHost, request: Request, action: str) -> Response:
    """Requeue the dead-lettered jobs ticked in the form (or the one of a row's button)."""
    scope = dashboard.organization(request)
    targets = request.form_list("job_id")
    if not targets:
        raise rl.InvalidArgument("job_id", None, "at least one dead-lettered job chosen")
    if len(targets) > REPLAY_LIMIT:
        raise rl.InvalidArgument("job_id", len(targets), f"at most {REPLAY_LIMIT} jobs at once")
    replayed = 0
    # One read for the whole selection; a job replayed already, or out of scope, is left alone.
    statuses = job_statuses(dashboard.engine, targets, organization_id=scope)
    for job_id, status in statuses.items():
        if status is not rl.JobStatus.DEAD_LETTERED:
            continue  # never requeue a job that is not dead-lettered
        try:
            rl.requeue_job(dashboard.engine, job_id, reason=REPLAY_REASON, organization_id=scope)
        except rl.InvalidStateTransition:
            continue  # replayed by someone else meanwhile
        replayed += 1
    return Response.redirect(request.url("/dead-letters", replayed=replayed))


def schedules(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    listed = [s for s in rl.list_schedules(dashboard.engine) if scope is None or s.organization_id == scope]
    done = request.arg("done")
    return dashboard.render(request, "schedules.html", schedules=listed,
                            done=done if done in SCHEDULE_DONE.values() else None, done_name=request.arg("name"))


def _schedule_in_scope(dashboard: PageHost, name: Optional[str], scope: Optional[str]) -> str:
    if name is None:
        raise rl.InvalidArgument("name", None, "a schedule name")
    schedule = rl.get_schedule(dashboard.engine, name)
    if schedule is None or (scope is not None and schedule.organization_id != scope):
        raise rl.ScheduleNotFound(f"schedule {name!r} was not found", name=name)
    return schedule.name


def schedule_action(dashboard: PageHost, request: Request, action: str) -> Response:
    name = _schedule_in_scope(dashboard, request.form("name"), dashboard.organization(request))
    if action == "pause":
        rl.pause_schedule(dashboard.engine, name)
    elif action == "resume":
        rl.resume_schedule(dashboard.engine, name)
    else:
        rl.trigger_schedule(dashboard.engine, name)
    return Response.redirect(request.url("/schedules", done=SCHEDULE_DONE[action], name=name))
