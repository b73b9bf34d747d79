"""Print the plans and times of the listing and counting queries on a large job_queue: every one must read an index.

Usage: python bench/listing_plans.py [--rows 1000000] [--database-url URL]
Fills job_queue with finished jobs and a few pending, leased, dead-lettered and
canceled ones (a fifth of them in 50 organizations), then runs what `jobs list`,
`jobs count`, `stats` and a dashboard ask: newest first by status, type and
organization, a keyset page on (created_at, id), counts by status and type. It
prints each plan (EXPLAIN ANALYZE) and exits 1 if any but the unscoped stats reads
job_queue whole (counting every job reads every row, by index or by table).
"""

from __future__ import annotations

import argparse
import sys
import time

import _common as bench
from sqlalchemy import Text, event, literal_column, select, text, tuple_

import runledger_sync as rl
from runledger_sync.db.schema import job_queue
from runledger_sync.store.admin.jobs import count_jobs, list_jobs
from runledger_sync.store.admin.stats import queue_stats

TYPES = [f"bench.type_{n}" for n in range(5)]

# Shares of the rows per status (the rest SUCCEEDED), and the count of leased rows.
_FILL_SQL = """
INSERT INTO job_queue (id, job_type, organization_id, status, stage, max_attempts, attempt, created_at,
                       lease_expires_at, worker_id, finished_at)
SELECT gen_random_uuid(), 'bench.type_' || (n % 5),
       CASE WHEN n % 5 = 0 THEN 'org-' || (n % 50) END,
       s.status, CASE WHEN s.status = 'PENDING' THEN 'queued' ELSE 'completed' END, 3,
       CASE WHEN s.status = 'PENDING' THEN 0 ELSE 1 END,
       now() - make_interval(secs => (:rows - n) * 2.5),
       CASE WHEN s.status = 'LEASED' THEN now() + interval '1 minute' END,
       CASE WHEN s.status = 'LEASED' THEN 'bench' END,
       CASE WHEN s.status IN ('SUCCEEDED', 'DEAD_LETTERED', 'CANCELED') THEN now() END
FROM generate_series(1, :rows) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN n > :rows - 200 THEN 'LEASED'
    WHEN n % 100 = 7 THEN 'PENDING'
    WHEN n % 100 = 13 THEN 'DEAD_LETTERED'
    WHEN n % 200 = 21 THEN 'CANCELED'
    ELSE 'SUCCEEDED' END AS status) AS s
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    bench.add_database_option(parser)
    return parser.parse_args()


def fill(engine, rows: int) -> None:
    registry = rl.JobRegistry()
    for job_type in TYPES:
        registry.job(job_type)(lambda context, payload: None)
    registry.sync_definitions(engine)
    with engine.begin() as connection:
        connection.execute(text(_FILL_SQL), {"rows": rows})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM ANALYZE job_queue")


class Explainer:
    """EXPLAIN ANALYZE every statement run on the engine, on the same cursor with the same parameters."""

    def __init__(self, engine) -> None:
        self.plans: list[str] = []
        event.listen(engine, "before_cursor_execute", self._explain)

    def _explain(self, _conn, cursor, statement, parameters, _context, _executemany) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH", "(SELECT")) and "job_queue" in statement:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) " + statement, parameters)
            self.plans.append("\n".join(row[0] for row in cursor.fetchall()))


def keyset_page(engine, status: str) -> None:
    """A dashboard's next page: rows older than the last one shown, on (created_at, id)."""
    with engine.connect() as connection:
        last = connection.execute(text(
            "SELECT created_at, id FROM job_queue WHERE status = :s ORDER BY created_at DESC, id DESC OFFSET 500 LIMIT 1"
        ), {"s": status}).one()
        # The status as SQL text (from JobStatus), so the planner can use the partial index.
        q = job_queue.c
        connection.execute(
            select(q.id)
            .where(q.status == literal_column(f"'{rl.JobStatus(status).value}'", Text),
                   tuple_(q.created_at, q.id) < tuple_(last.created_at, last.id))
            .order_by(q.created_at.desc(), q.id.desc())
            .limit(50)
        ).all()


#: Queries that count every job: the planner may read the table or an index whole.
EVERY_ROW = {"stats (counts by type and status)"}

QUERIES = {
    "list, newest first": lambda e: list_jobs(e, limit=50),
    "list, newest first, page 20": lambda e: list_jobs(e, limit=50, offset=1000),
    "list PENDING": lambda e: list_jobs(e, status="PENDING", limit=50),
    "list LEASED": lambda e: list_jobs(e, status="LEASED", limit=50),
    "list SUCCEEDED": lambda e: list_jobs(e, status="SUCCEEDED", limit=50),
    "list DEAD_LETTERED": lambda e: list_jobs(e, status="DEAD_LETTERED", limit=50),
    "list CANCELED of a type": lambda e: list_jobs(e, status="CANCELED", job_type=TYPES[1], limit=50),
    "list a type": lambda e: list_jobs(e, job_type=TYPES[2], limit=50),
    "list an organization": lambda e: list_jobs(e, organization_id="org-10", limit=50),
    "list an organization's DEAD_LETTERED": lambda e: list_jobs(
        e, status="DEAD_LETTERED", organization_id="org-10", limit=50),
    "keyset page, SUCCEEDED": lambda e: keyset_page(e, "SUCCEEDED"),
    "keyset page, DEAD_LETTERED": lambda e: keyset_page(e, "DEAD_LETTERED"),
    "count DEAD_LETTERED": lambda e: count_jobs(e, status="DEAD_LETTERED"),
    "count a type": lambda e: count_jobs(e, job_type=TYPES[3]),
    "count an organization": lambda e: count_jobs(e, organization_id="org-10"),
    "stats (counts by type and status)": lambda e: queue_stats(e),
    "stats of an organization": lambda e: queue_stats(e, organization_id="org-10"),
}


def main() -> int:
    args = parse_args()
    whole_reads = []
    with bench.server(args.database_url) as srv, bench.fresh_database(srv, "bench_listing_plans") as url:
        engine = bench.migrated_engine(url)
        try:
            started = time.perf_counter()
            fill(engine, args.rows)
            print(f"{args.rows:,} rows in {time.perf_counter() - started:.0f} s")
            explainer = Explainer(engine)
            for name, query in QUERIES.items():
                explainer.plans.clear()
                query(engine)
                print(f"\n=== {name}")
                for plan in explainer.plans:
                    print(plan)
                    if "Seq Scan on job_queue" in plan and name not in EVERY_ROW:
                        whole_reads.append(name)
        finally:
            engine.dispose()
    print("\nqueries reading job_queue whole:", ", ".join(whole_reads) or "none")
    return 1 if whole_reads else 0


if __name__ == "__main__":
    sys.exit(main())
