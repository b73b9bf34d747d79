"""The Queues page: every queue's settings and what waits in it; pause, resume and new limits.

A queue is shared by every organization: pausing one, or changing its limits,
holds back every organization's jobs in it. So a dashboard scoped to one
organization shows the settings alone (its counts would count other
organizations' jobs) and refuses the actions.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.core.dashboard_errors import ActionForbidden
from runledger_sync.core.flow import LIMIT_RANGE
from runledger_sync.core.queue_errors import InvalidQueueName
from runledger_sync.web.http import PageHost, Request, Response

#: What the operator is told after an action, by the ``done`` query value (never echoed as given).
QUEUE_DONE = {"pause_queue": "paused", "resume_queue": "resumed", "configure_queue": "changed"}
#: The form's fields, named as the settings :func:`rl.configure_queue` takes, so an error names the field.
GLOBAL_LIMIT, KEY_LIMIT = "global_limit", "key_limit"
RATE_COUNT, RATE_SECONDS, RATE_PER_KEY = "rate_limit.count", "rate_limit.per_seconds", "rate_limit.per_key"
# Bounded, so int() and float() never see thousands of digits; the range itself is configure_queue's to check.
_WHOLE = re.compile(r"-?[0-9]{1,9}")
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")
_NO_LIMIT = f"blank for no limit, or a whole number from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]:,}"


def queues(dashboard: PageHost, request: Request) -> Response:
    """Every queue, or with ``?queue=NAME`` that one queue and the form that changes its limits."""
    scope = dashboard.organization(request)
    name = request.arg("queue")
    if name is not None:
        rl.get_queue(dashboard.engine, name)  # a coded error for a bad or unknown name
    loads = rl.queue_loads(dashboard.engine)
    chosen = next((load for load in loads if load.queue.name == name), None) if name is not None else None
    done = request.arg("done")
    return dashboard.render(
        request, "queues.html", loads=loads, chosen=chosen, show_counts=scope is None, shared_actions=scope is None,
        done=done if done in QUEUE_DONE.values() else None, done_name=request.arg("name"),
    )


def queue_action(dashboard: PageHost, request: Request, action: str) -> Response:
    if dashboard.organization(request) is not None:
        raise ActionForbidden("a queue is shared by every organization: a dashboard scoped to one organization "
                              "cannot pause, resume or change it", action=action)
    name = request.form("name")
    if name is None:
        raise InvalidQueueName("name", None, "a queue name")
    if action == "pause_queue":
        rl.pause_queue(dashboard.engine, name)
    elif action == "resume_queue":
        rl.resume_queue(dashboard.engine, name)
    else:
        settings = _settings_of(request)  # bad input is refused before anything is read or written
        rl.get_queue(dashboard.engine, name)  # the form changes a queue; it never creates one
        rl.configure_queue(dashboard.engine, name, **settings)
    return Response.redirect(request.url("/queues", done=QUEUE_DONE[action], name=name))


def _limit(request: Request, field: str) -> Optional[int]:
    value = request.form(field)
    if value is None:
        return None
    if not _WHOLE.fullmatch(value):
        raise rl.InvalidQueueSetting(field, value, _NO_LIMIT)
    return int(value)


def _settings_of(request: Request) -> dict[str, Any]:
    """The limits the form asks for; a blank field is no limit (the form is drawn filled with the current ones)."""
    count = _limit(request, RATE_COUNT)
    rate = None
    if count is not None:
        seconds = request.form(RATE_SECONDS)
        if seconds is None or not _SECONDS.fullmatch(seconds):
            raise rl.InvalidQueueSetting(RATE_SECONDS, seconds, "a number of seconds (such as 1 or 0.5) with a rate count")
        rate = rl.RateLimit(count, float(seconds), per_key=request.form(RATE_PER_KEY) is not None)
    return {"global_limit": _limit(request, GLOBAL_LIMIT), "key_limit": _limit(request, KEY_LIMIT), "rate_limit": rate}
