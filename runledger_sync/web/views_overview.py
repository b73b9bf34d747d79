"""The overview page: counts by status and type, queues, throughput over the last hour, oldest due job, workers, failures."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import runledger_sync as rl
from runledger_sync.store.admin import recent_overview
from runledger_sync.web.http import PageHost, Request, Response

#: Height in pixels of the throughput chart's tallest bar.
CHART_HEIGHT = 120


def _bars(overview: Any) -> list[dict[str, Any]]:
    """One bar per minute of the window, the empty minutes included, scaled to the busiest minute."""
    counts = {minute: (ok, failed) for minute, ok, failed in overview.finished_per_minute}
    last = overview.as_of.replace(second=0, microsecond=0)
    minutes = [last - timedelta(minutes=back) for back in range(overview.window_minutes - 1, -1, -1)]
    busiest = max((ok + failed for ok, failed in counts.values()), default=0) or 1
    bars = []
    for index, minute in enumerate(minutes):
        ok, failed = counts.get(minute, (0, 0))
        bars.append({
            "x": index, "minute": minute, "ok": ok, "failed": failed,
            "ok_height": round(CHART_HEIGHT * ok / busiest), "failed_height": round(CHART_HEIGHT * failed / busiest),
        })
    return bars


def overview(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    stats = rl.queue_stats(dashboard.engine, organization_id=scope)
    recent = recent_overview(dashboard.engine, organization_id=scope)
    by_type: dict[str, dict[str, int]] = {}
    for (job_type, status), count in sorted(stats.by_type_and_status.items()):
        by_type.setdefault(job_type, {})[status] = count
    return dashboard.render(
        request, "overview.html", stats=stats, recent=recent, by_type=by_type,
        statuses=[status.value for status in rl.JobStatus], bars=_bars(recent), chart_height=CHART_HEIGHT,
        refresh=request.arg("refresh") != "0",
        # Queues are shared by every organization: a scoped overview shows their settings, not their counts.
        queue_loads=rl.queue_loads(dashboard.engine), show_queue_counts=scope is None,
    )

