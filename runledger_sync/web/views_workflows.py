"""Workflow runs and their step graphs, read through the public workflow API (no SQL of its own)."""

from __future__ import annotations

from typing import Optional

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowStepRecord
from runledger_sync.web.http import PageHost, Request, Response

RUNS_SHOWN = 100
#: Steps drawn per page of a run's graph: a run of thousands of steps is read a page at a time.
STEPS_SHOWN = 200


def _depths(steps: list[WorkflowStepRecord]) -> dict[str, int]:
    """Each step's depth, one more than the deepest step it waits for, found with a stack (chains run deep)."""
    by_key = {step.key: step for step in steps}
    depth: dict[str, int] = {}
    for step in steps:
        stack = [step.key]
        while stack:
            key = stack[-1]
            if key in depth:
                stack.pop()
                continue
            waiting = [k for k in by_key[key].deps if k in by_key and k not in depth]
            if waiting:
                # A run's steps form no cycle (the builder refuses one), so this ends.
                stack.extend(waiting)
                continue
            depth[key] = 1 + max((depth[k] for k in by_key[key].deps if k in by_key), default=-1)
            stack.pop()
    return depth


def _layers(steps: list[WorkflowStepRecord]) -> list[list[WorkflowStepRecord]]:
    """Steps grouped by depth: a step sits one layer below the deepest step it waits for."""
    depth = _depths(steps)
    layers: dict[int, list[WorkflowStepRecord]] = {}
    for step in steps:
        layers.setdefault(depth[step.key], []).append(step)
    return [layers[d] for d in sorted(layers)]


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
        run = rl.get_workflow_run(dashboard.engine, run_id)
        if run is None or (scope is not None and run.organization_id != scope):
            raise rl.WorkflowRunNotFound(f"workflow run {run_id} was not found")
        pages = max(1, -(-len(run.steps) // STEPS_SHOWN))
        page = min(page, pages)
        return dashboard.render(
            request, "workflows.html", runs=[], run=run, layers=_page_of_layers(_layers(list(run.steps)), page),
            page=page, pages=pages, first_shown=(page - 1) * STEPS_SHOWN + 1,
            last_shown=min(page * STEPS_SHOWN, len(run.steps)),
        )
    runs = rl.list_workflow_runs(dashboard.engine, organization_id=scope, limit=RUNS_SHOWN)
    return dashboard.render(request, "workflows.html", runs=runs, run=None, layers=[])
