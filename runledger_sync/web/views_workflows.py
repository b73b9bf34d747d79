"""Workflow runs and their step graphs, read and acted on through the public workflow API (no SQL of its own).

The actions are named as the API calls they make: ``cancel_workflow_run`` and
``complete_external_step`` (the answer to a step that waits for one).
"""

from __future__ import annotations

import json
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.core.workflow import (
    WorkflowReleaseMode, WorkflowRunStatus, WorkflowStepRecord, WorkflowStepStatus,
)
from runledger_sync.web import dag_layout
from runledger_sync.web.http import PageHost, Request, Response

RUNS_SHOWN = 100
#: Steps drawn per page of a run's graph: a run of thousands of steps is read a page at a time.
STEPS_SHOWN = 200
#: What the operator is told after an action, by the ``done`` query value (never echoed as given).
WORKFLOW_DONE = {"canceled": "The run was canceled.", "answered": "The step was answered."}
#: The answers a form may give an external step: the button pressed.
ANSWERS = {"succeeded": True, "failed": False}
#: A run in one of these has ended: nothing left to cancel.
FINISHED = (WorkflowRunStatus.SUCCEEDED, WorkflowRunStatus.COMPLETED_WITH_ERRORS, WorkflowRunStatus.CANCELED)
CANCEL_REASON = "CANCELED_FROM_DASHBOARD"


def _page_number(value: Optional[str]) -> int:
    if value is None:
        return 1
    if not value.isdigit() or len(value) > 9 or int(value) < 1:
        raise rl.InvalidArgument("page", value, "a page number (1, 2, ...)")
    return int(value)


def _page_of_layers(layers: list[list[WorkflowStepRecord]], page: int) -> list[list[WorkflowStepRecord]]:
    """The layers cut to the steps of ``page``, in drawing order (layer by layer)."""
    start, end = (page - 1) * STEPS_SHOWN, page * STEPS_SHOWN
    shown: list[list[WorkflowStepRecord]] = []
    seen = 0
    for layer in layers:
        if seen >= end:
            break
        part = layer[max(0, start - seen):end - seen]
        if part:
            shown.append(part)
        seen += len(layer)
    return shown


def workflows(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    run_id = request.arg("run")
    if run_id is not None:
        page = _page_number(request.arg("page"))
        run = _run_in_scope(dashboard, run_id, scope)
        pages = max(1, -(-len(run.steps) // STEPS_SHOWN))
        page = min(page, pages)
        shown = _page_of_layers(dag_layout.layers(list(run.steps)), page)
        steps = [step for column in shown for step in column]
        return dashboard.render(
            request, "workflows.html", runs=[], run=run, graph=dag_layout.layout(shown), steps=steps,
            on_success={step.key for step in steps if step.release is WorkflowReleaseMode.ON_SUCCESS},
            statuses=list(WorkflowStepStatus),
            appended_by={key: mutation.mutation_key for mutation in run.mutations for key in mutation.step_keys},
            page=page, pages=pages, first_shown=(page - 1) * STEPS_SHOWN + 1,
            last_shown=min(page * STEPS_SHOWN, len(run.steps)), cancelable=run.status not in FINISHED,
            done=WORKFLOW_DONE.get(request.arg("done") or ""), done_step=request.arg("step"),
            node_width=dag_layout.NODE_WIDTH, node_height=dag_layout.NODE_HEIGHT,
        )
    runs = rl.list_workflow_runs(dashboard.engine, organization_id=scope, limit=RUNS_SHOWN)
    return dashboard.render(request, "workflows.html", runs=runs, run=None)


def _run_in_scope(dashboard: PageHost, run_id: Optional[str], scope: Optional[str]) -> rl.WorkflowRunRecord:
    if run_id is None:
        raise rl.InvalidArgument("run_id", None, "a workflow run id")
    run = rl.get_workflow_run(dashboard.engine, run_id)
    if run is None or (scope is not None and run.organization_id != scope):
        raise rl.WorkflowRunNotFound(f"workflow run {run_id} was not found")
    return run


def workflow_action(dashboard: PageHost, request: Request, action: str) -> Response:
    run = _run_in_scope(dashboard, request.form("run_id"), dashboard.organization(request))
    if action == "cancel_workflow_run":
        rl.cancel_workflow_run(dashboard.engine, run.id, reason=CANCEL_REASON)
        return Response.redirect(request.url("/workflows", run=run.id, done="canceled"))
    step_key = request.form("step_key")
    if step_key is None:
        raise rl.InvalidArgument("step_key", None, "the key of the external step to answer")
    answer = request.form("outcome")
    if answer not in ANSWERS:
        raise rl.InvalidArgument("outcome", answer, "succeeded or failed")
    rl.complete_external_step(dashboard.engine, run.id, step_key, succeeded=ANSWERS[answer],
                              output=_output_of(request) if ANSWERS[answer] else None)
    return Response.redirect(request.url("/workflows", run=run.id, done="answered", step=step_key))


def _output_of(request: Request) -> Any:
    """The answer's output: blank for none, else a JSON value (its size is complete_external_step's to bound)."""
    text = request.form("output")
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise rl.InvalidArgument("output", shown, "a JSON value, such as {\"approved_by\": \"ada\"}") from None
