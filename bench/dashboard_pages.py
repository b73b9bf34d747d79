"""Print how long each dashboard page takes on a large job_queue, deep keyset pages and searches included.

Usage: python bench/dashboard_pages.py [--rows 1000000] [--events 100000] [--repeat 5] [--database-url URL]
Fills job_queue as bench/listing_plans.py does (one in five rows with an
idempotency key), adds finished-attempt events over the last two hours, then
asks the WSGI app for each page in-process (no HTTP) and prints the median and
slowest of ``--repeat`` requests.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

import _common as bench
import listing_plans
from sqlalchemy import text
from werkzeug.test import Client

import runledger_sync as rl
from runledger_sync.store.admin.overview import recent_overview
from runledger_sync.web import allow_anyone, create_app

_KEYS_SQL = ("UPDATE job_queue SET idempotency_key = 'order-' || id::text, enqueue_request = '{}'::jsonb "
             "WHERE hashtext(id::text) % 5 = 0")
_EVENTS_SQL = """
INSERT INTO job_events (job_id, run_number, attempt, event_type, payload, occurred_at)
SELECT id, 1, 1, CASE WHEN n % 10 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END,
       CASE WHEN n % 10 = 0 THEN jsonb_build_object('error_code', 'bench.code_' || (n % 7)) ELSE '{}'::jsonb END,
       now() - make_interval(secs => n * 7200.0 / :events)
FROM (SELECT id, row_number() OVER () AS n FROM job_queue WHERE status = 'SUCCEEDED' LIMIT :events) AS finished
"""
NEXT_PAGE = re.compile(r'id="next-page" href="([^"]+)"')


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    bench.add_database_option(parser)
    return parser.parse_args()


def fill(engine, rows: int, events: int) -> None:
    listing_plans.fill(engine, rows)
    with engine.begin() as connection:
        connection.execute(text(_KEYS_SQL))
        connection.execute(text(_EVENTS_SQL), {"events": events})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM ANALYZE job_queue")
        connection.exec_driver_sql("VACUUM ANALYZE job_events")


def deep_cursor(engine, depth: int) -> str:
    """The id of the job ``depth`` rows down the SUCCEEDED list: a page cursor that deep."""
    with engine.connect() as connection:
        return str(connection.execute(text(
            "SELECT id FROM job_queue WHERE status = 'SUCCEEDED' ORDER BY created_at DESC, id DESC OFFSET :d LIMIT 1"
        ), {"d": depth}).scalar_one())


def timed(client: Client, url: str, repeat: int) -> tuple[float, float, str]:
    times, body = [], ""
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        body = response.get_data(as_text=True)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
    return statistics.median(times) * 1000, max(times) * 1000, body


def main() -> int:
    args = parse_args()
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_dashboard_pages") as url:
        engine = bench.migrated_engine(url)
        try:
            started = time.perf_counter()
            fill(engine, args.rows, args.events)
            print(f"{args.rows:,} jobs and {args.events:,} events in {time.perf_counter() - started:.0f} s")
            client = Client(create_app(engine, authorize=allow_anyone))
            with engine.connect() as connection:
                some = connection.execute(text(
                    "SELECT id, idempotency_key FROM job_queue WHERE idempotency_key IS NOT NULL LIMIT 1 OFFSET 100000"
                )).one()
            pages = {
                "overview": "/",
                "jobs, first page": "/jobs",
                "jobs SUCCEEDED, first page": "/jobs?status=SUCCEEDED",
                "jobs SUCCEEDED, 500,000 rows down": f"/jobs?status=SUCCEEDED&before={deep_cursor(engine, 500_000)}",
                "jobs, 500,000 rows down": f"/jobs?before={deep_cursor(engine, 500_000)}",
                "jobs of a type and organization": "/jobs?type=bench.type_0&org=org-10",
                "search a job id": f"/jobs?q={some.id}",
                "search an idempotency key": f"/jobs?q={some.idempotency_key}",
                "search a key prefix (common)": "/jobs?q=order-",
                "job page": f"/jobs/{some.id}",
                "dead letters": "/dead-letters",
            }
            print(f"{'page':<40} {'median ms':>10} {'max ms':>10}")
            for name, page_url in pages.items():
                median, slowest, _ = timed(client, page_url, args.repeat)
                print(f"{name:<40} {median:>10.1f} {slowest:>10.1f}")
            # The overview's two reads apart: which one its time goes to.
            for name, read in (("  of which queue_stats", rl.queue_stats), ("  of which recent_overview", recent_overview)):
                times = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    read(engine)
                    times.append(time.perf_counter() - started)
                print(f"{name:<40} {statistics.median(times) * 1000:>10.1f} {max(times) * 1000:>10.1f}")
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
