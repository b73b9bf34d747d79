"""The overview page: counts by status and type, queues, charts of the last hour, oldest due job, workers, failures."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import runledger_sync as rl
from runledger_sync.store.admin.rollup import RollupPoint, rollup_series
from runledger_sync.store.admin.overview import recent_overview
from runledger_sync.web.charts import Chart, Series, line_chart, minutes_of, stacked_bars
from runledger_sync.web.http import PageHost, Request, Response

#: Minutes the charts show, the last closed one at the right.
CHART_MINUTES = 60
#: The outcomes stacked in the throughput chart: (rollup field, legend name, CSS class), bottom up.
OUTCOMES = (("succeeded", "succeeded", "succeeded"), ("retried", "retried", "retried"),
            ("dead_lettered", "dead-lettered", "dead-lettered"), ("canceled", "canceled", "canceled"))


@dataclass(frozen=True)
class OverviewCharts:
    throughput: Chart
    ready: Chart
    wait: Chart


def _charts(engine: Any, queue: Optional[str]) -> OverviewCharts:
    """The last hour of the rollup (every queue, or one) as three charts; a minute not sampled is a gap, not a zero."""
    rollup = rollup_series(engine, window_minutes=CHART_MINUTES, queue=queue)
    last = rollup.as_of.replace(second=0, microsecond=0) - timedelta(minutes=1)
    minutes = minutes_of(last, CHART_MINUTES)
    sampled = {point.minute: point for point in rollup.points}
    points: list[Optional[RollupPoint]] = [sampled.get(minute) for minute in minutes]

    def values(field: str) -> list[Optional[float]]:
        # A sampled minute with nothing due has no oldest wait: it waited 0 s.
        return [None if p is None else float(getattr(p, field) or 0) for p in points]

    return OverviewCharts(
        throughput=stacked_bars("Attempts finished per minute", minutes,
                                [Series(name, css, values(field)) for field, name, css in OUTCOMES], unit="attempts"),
        ready=line_chart("Due jobs waiting for a worker", minutes,
                         [Series("due jobs", "due", values("ready"))], unit="jobs", whole=True),
        wait=line_chart("Oldest due job's wait (seconds)", minutes,
                        [Series("oldest wait", "oldest-wait", values("oldest_due_wait_seconds"))], unit="s"),
    )


def overview(dashboard: PageHost, request: Request) -> Response:
    scope = dashboard.organization(request)
    stats = rl.queue_stats(dashboard.engine, organization_id=scope)
    recent = recent_overview(dashboard.engine, organization_id=scope)
    by_type: dict[str, dict[str, int]] = {}
    for (job_type, status), count in sorted(stats.by_type_and_status.items()):
        by_type.setdefault(job_type, {})[status] = count
    queue_loads = rl.queue_loads(dashboard.engine)
    # Only a queue that exists is charted alone; any other value charts every queue.
    chart_queue = request.arg("queue") if request.arg("queue") in {load.queue.name for load in queue_loads} else None
    return dashboard.render(
        request, "overview.html", stats=stats, recent=recent, by_type=by_type,
        statuses=[status.value for status in rl.JobStatus],
        # The rollup counts every organization's jobs: a scoped overview does not show it.
        charts=_charts(dashboard.engine, chart_queue) if scope is None else None, chart_queue=chart_queue,
        refresh=request.arg("refresh") != "0",
        # Queues are shared by every organization: a scoped overview shows their settings, not their counts.
        queue_loads=queue_loads, show_queue_counts=scope is None,
    )
