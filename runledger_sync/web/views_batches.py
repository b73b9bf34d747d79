"""Batches and their progress, read through the public batch API (no SQL of its own).

A batch belongs to no organization, and its members may belong to any: a
dashboard scoped to an organization shows no batch.
"""

from __future__ import annotations

from typing import Optional

import runledger_sync as rl
from runledger_sync.web.http import PageHost, Request, Response

BATCHES_SHOWN = 100
#: Members listed on a batch's page, the first added; the CLI's ``batches show --members`` lists others.
MEMBERS_SHOWN = 100


def batches(dashboard: PageHost, request: Request) -> Response:
    scoped = dashboard.organization(request) is not None
    batch_id = request.arg("batch")
    if batch_id is not None:
        batch = _batch(dashboard, batch_id, scoped)
        members = rl.list_batch_members(dashboard.engine, batch.id, limit=MEMBERS_SHOWN)
        runs = rl.list_batch_runs(dashboard.engine, batch.id, limit=MEMBERS_SHOWN) if batch.runs else []
        return dashboard.render(request, "batches.html", batches=[], batch=batch, members=members, runs=runs,
                                bar=progress_bar(batch))
    shown = [] if scoped else rl.list_batches(dashboard.engine, limit=BATCHES_SHOWN)
    return dashboard.render(request, "batches.html", batches=[(b, progress_bar(b)) for b in shown], batch=None,
                            scoped=scoped)


def _batch(dashboard: PageHost, batch_id: str, scoped: bool) -> rl.BatchRecord:
    batch: Optional[rl.BatchRecord] = None if scoped else rl.get_batch(dashboard.engine, batch_id)
    if batch is None:
        raise rl.BatchNotFound(f"batch {batch_id} was not found")
    return batch


def progress_bar(batch: rl.BatchRecord) -> list[tuple[str, int, float, float]]:
    """The bar's parts, (outcome, count, start, width), in percent of the members, for the outcomes that have any."""
    parts = (("succeeded", batch.succeeded), ("failed", batch.failed), ("canceled", batch.canceled),
             ("pending", batch.pending))
    drawn: list[tuple[str, int, float, float]] = []
    start = 0.0
    for name, count in parts:
        if count and batch.total:
            width = round(count * 100 / batch.total, 2)
            drawn.append((name, count, start, width))
            start = round(start + width, 2)
    return drawn
