"""Workflow runs and their step graphs, through the public workflow API when the installed library has it.

Kept apart from the other views on purpose: it reads only ``rl.list_workflow_runs``
and ``rl.get_workflow_run`` and writes no SQL of its own; without them the page
says that this version has no workflow support.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import runledger_sync as rl
from runledger_sync.web.http import Request, Response

if TYPE_CHECKING:
    from runledger_sync.web.app import Dashboard

RUNS_SHOWN = 100


def _layers(steps: list[Any]) -> list[list[Any]]:
    """Steps grouped by depth: a step sits one layer below the deepest step it waits for."""
    by_key = {step.step_key: step for step in steps}
    depth: dict[str, int] = {}

    def depth_of(key: str, seen: frozenset[str]) -> int:
        if key not in depth:
            after = [k for k in getattr(by_key[key], "depends_on", ()) if k in by_key and k not in seen]
            depth[key] = 1 + max((depth_of(k, seen | {key}) for k in after), default=-1)
        return depth[key]

    layers: dict[int, list[Any]] = {}
    for step in steps:
        layers.setdefault(depth_of(step.step_key, frozenset()), []).append(step)
    return [layers[d] for d in sorted(layers)]


def workflows(dashboard: "Dashboard", request: Request) -> Response:
    if not hasattr(rl, "list_workflow_runs"):
        return dashboard.render(request, "workflows.html", supported=False, runs=[], run=None, layers=[])
    scope = dashboard.organization(request)
    run_id = request.arg("run")
    run = rl.get_workflow_run(dashboard.engine, run_id) if run_id is not None else None
    if run is not None and scope is not None and run.organization_id != scope:
        run = None
    runs = [] if run is not None else rl.list_workflow_runs(dashboard.engine, limit=RUNS_SHOWN)
    runs = [r for r in runs if scope is None or r.organization_id == scope]
    return dashboard.render(request, "workflows.html", supported=True, runs=runs, run=run,
                            layers=_layers(list(run.steps)) if run is not None else [])
