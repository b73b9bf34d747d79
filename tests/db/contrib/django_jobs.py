"""The job registry the Django settings of the contrib tests name (RUNLEDGER["REGISTRY"])."""

from __future__ import annotations

from typing import Any

from django.db import connections

import runledger_sync as rl
from runledger_sync.metrics import WorkerMetrics

JOB_TYPE = "django.order_placed"

#: One entry per run: (was this thread's Django connection open at entry, the connection wrapper, payload).
runs: list[tuple[bool, Any, Any]] = []
registry = rl.JobRegistry()


@registry.job(JOB_TYPE)
def order_placed(ctx: Any, payload: Any) -> None:
    connection = connections["default"]
    was_open = connection.connection is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    runs.append((was_open, connection, payload))


def dashboard_operator(request: Any, action: str) -> bool:
    """The dashboard's authorize hook in the test settings: reads for all, actions for the operator ada.

    It is given the Django request, as a project's own hook is.
    """
    return action == "view" or request.META.get("HTTP_X_OPERATOR") == "ada"


#: The worker's observer, when a test names it in RUNLEDGER["OBSERVER"].
worker_metrics = WorkerMetrics()
