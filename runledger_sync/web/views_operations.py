"""Dead letters (filter; replay one, the ticked ones, or every one the filter matches) and schedules (pause, resume, trigger)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.store.admin.gauges import LATE_SCHEDULE_SECONDS
from runledger_sync.store.admin.jobs import job_statuses
from runledger_sync.web.http import PageHost, Request, Response

DEAD_LETTER_PAGE = 100
#: The most jobs one replay of ticked jobs requeues: one page of the list.
REPLAY_LIMIT = DEAD_LETTER_PAGE
#: The most jobs one replay of a whole filter requeues, so a request ends in seconds;
#: what is left is counted on the page, and the button replays the next ones.
REPLAY_FILTER_LIMIT = 10_000
#: Jobs requeued per transaction by a replay of a whole filter.
REPLAY_BATCH = 500
REPLAY_REASON = "DEAD_LETTER_REPLAY"
#: The dead-letter filters: query parameter -> the store's argument.
DEAD_LETTER_FILTERS = {"type": "job_type", "code": "error_code", "error_type": "error_type"}
SCHEDULE_DONE = {"pause": "paused", "resume": "resumed", "trigger": "triggered"}


def _dead_letter_filter(dashboard: PageHost, request: Request, values: dict[str, Optional[str]]) -> dict[str, Any]:
    """The store's filter arguments from ``values`` (the query's or the form's); the scope wins over ``org``."""
    scope = dashboard.organization(request)
    chosen: dict[str, Any] = {argument: values.get(name) for name, argument in DEAD_LETTER_FILTERS.items()}
    chosen["organization_id"] = scope if scope is not None else values.get("org")
    return chosen


def _filter_query(chosen: dict[str, Any], scope: Optional[str]) -> dict[str, Any]:
    """The filter as query parameters again, for the page's links (the scope is never put in a URL)."""
    query = {name: chosen[argument] for name, argument in DEAD_LETTER_FILTERS.items()}
    query["org"] = chosen["organization_id"] if scope is None else None
    return query


def dead_letters(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    chosen = _dead_letter_filter(dashboard, request, {name: request.arg(name) for name in (*DEAD_LETTER_FILTERS, "org")})
    letters = rl.list_dead_letters(dashboard.engine, **chosen, limit=DEAD_LETTER_PAGE)
    # A dead-letter row outlives a replay; the job's status tells whether it is still dead.
    statuses = job_statuses(dashboard.engine, [letter.job_id for letter in letters],
                            organization_id=chosen["organization_id"])
    rows = [(letter, statuses.get(letter.job_id) is rl.JobStatus.DEAD_LETTERED) for letter in letters]
    return dashboard.render(
        request, "dead_letters.html", rows=rows, filters=chosen, query=_filter_query(chosen, scope),
        # Counted up to one past what a click replays: enough to say "more than" that.
        replayable=rl.count_dead_letters(dashboard.engine, **chosen, at_most=REPLAY_FILTER_LIMIT + 1),
        replayed=_count_arg(request, "replayed"),
        replay_cap=REPLAY_FILTER_LIMIT,
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
    """Requeue the dead-lettered jobs ticked in the form (or the one of a row's button), or every one the filter matches."""
    scope = dashboard.organization(request)
    if action == "replay_dead_letters":
        chosen = _dead_letter_filter(dashboard, request, {name: request.form(name) for name in (*DEAD_LETTER_FILTERS, "org")})
        replayed = rl.replay_dead_letters(dashboard.engine, **chosen, batch_size=REPLAY_BATCH,
                                          limit=REPLAY_FILTER_LIMIT, reason=REPLAY_REASON)
        return Response.redirect(request.url("/dead-letters", replayed=replayed, **_filter_query(chosen, scope)))
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


def late_by(schedule: rl.ScheduleRecord, now: datetime) -> Optional[timedelta]:
    """How long an active schedule's fire is overdue, once past the grace a healthy scheduler needs; else None.

    The grace is the one the ``late_schedules`` gauge counts with: a running scheduler
    fires a due schedule within a poll interval, and retries a failed fire in 30 s.
    """
    overdue = now - schedule.next_fire_at
    if not schedule.is_active or overdue <= timedelta(seconds=LATE_SCHEDULE_SECONDS):
        return None
    return overdue


def schedules(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    listed = [s for s in rl.list_schedules(dashboard.engine) if scope is None or s.organization_id == scope]
    now = datetime.now(timezone.utc)
    rows = [(schedule, late_by(schedule, now)) for schedule in listed]
    done = request.arg("done")
    return dashboard.render(request, "schedules.html", rows=rows, late_count=sum(1 for _, late in rows if late),
                            grace_seconds=LATE_SCHEDULE_SECONDS,
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
