"""Workflow runs and their step graphs, read through the public workflow API (no SQL of its own)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import runledger_sync as rl
from runledger_sync.core.workflow import WorkflowStepRecord
from runledger_sync.web.http import Request, Response

if TYPE_CHECKING:
    from runledger_sync.web.app import Dashboard

RUNS_SHOWN = 100


def _layers(steps: list[WorkflowStepRecord]) -> list[list[WorkflowStepRecord]]:
    """Steps grouped by depth: a step sits one layer below the deepest step it waits for."""
    by_key = {step.key: step for step in steps}
    depth: dict[str, int] = {}

    def depth_of(key: str) -> int:
        # A run's steps form no cycle (the builder refuses one), so this ends.
        if key not in depth:
            depth[key] = 1 + max((depth_of(k) for k in by_key[key].deps if k in by_key), default=-1)
        return depth[key]

    layers: dict[int, list[WorkflowStepRecord]] = {}
    for step in steps:
        layers.setdefault(depth_of(step.key), []).append(step)
    return [layers[d] for d in sorted(layers)]


def workflows(dashboard: "Dashboard", request: Request) -> Response:
    scope = dashboard.organization(request)
    run_id = request.arg("run")
    if run_id is not None:
        run = rl.get_workflow_run(dashboard.engine, run_id)
        if run is None or (scope is not None and run.organization_id != scope):
            raise rl.WorkflowRunNotFound(f"workflow run {run_id} was not found")
        return dashboard.render(request, "workflows.html", runs=[], run=run, layers=_layers(list(run.steps)))
    runs = rl.list_workflow_runs(dashboard.engine, organization_id=scope, limit=RUNS_SHOWN)
    return dashboard.render(request, "workflows.html", runs=runs, run=None, layers=[])
