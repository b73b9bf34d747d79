"""Every prepared statement keeps a plan that stays cheap as the tables grow.

A prepared statement planned once keeps its plan for the connection's life. A
worker starts on a new database, whose tables were analyzed while empty: a plan
made then must still be right when they hold a million rows. Here every
prepared statement of the store is planned on analyzed empty tables, as the
worker's first calls plan it; the tables are then filled to 1,000,000 rows
(statistics left as they were, as between two autovacuum runs) and each
statement's kept plan is read again on the same session. A plan may read the
growing tables only through an index whose leading column its condition
fixes: never a sequential scan, never a walk over a whole index.
"""

from __future__ import annotations

import gc
import importlib
import json
import pkgutil
import re
from typing import Any, Iterator

import pytest
from sqlalchemy import text

import runledger_sync.store as store_package
from runledger_sync.db.pool_mode import policy_of
from runledger_sync.store.prepared import PLAN_ONCE_SQL, PreparedStatement, own

#: The tables that grow with the jobs run; the others hold one row per queue, type or schedule.
GROWING = ("job_queue", "job_attempts", "job_events", "job_dead_letters", "workflow_runs", "workflow_steps",
           "workflow_step_dependencies")
ROWS = 1_000_000
SCANS = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")


def all_prepared_statements() -> list[PreparedStatement]:
    for module in pkgutil.walk_packages(store_package.__path__, store_package.__name__ + "."):
        importlib.import_module(module.name)
    # type(), not isinstance(): a lazy object (Django's settings) answers isinstance by loading itself.
    found = {id(o): o for o in gc.get_objects() if type(o) is PreparedStatement}
    return sorted(found.values(), key=lambda statement: statement.label)


def kept_plan(connection: Any, statement: PreparedStatement) -> dict[str, Any]:
    """The plan ``statement`` runs with on ``connection``, asked the way the store runs it."""
    with connection.begin():
        rendered = statement._prepared_on(connection)
        # A generic plan does not depend on the values: every bound one is NULL here.
        execute = re.sub(r":\w+", "NULL", rendered.execute_sql)
        connection.exec_driver_sql(PLAN_ONCE_SQL, execution_options={"no_parameters": True})
        explained = connection.exec_driver_sql(
            f"EXPLAIN (FORMAT JSON) {execute}", execution_options={"no_parameters": True},
        ).scalar_one()
    return (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]


def leading_columns(connection: Any) -> dict[str, str]:
    """The leading column of each index on a growing table, but those that only hold what runs now."""
    rows = connection.execute(text(
        "SELECT i.relname, a.attname, pg_get_expr(x.indpred, x.indrelid) FROM pg_index x "
        "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
        "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] "
        "JOIN pg_namespace n ON n.oid = i.relnamespace "
        "WHERE n.nspname = current_schema() AND t.relname = ANY(:growing)"
    ), {"growing": list(GROWING)}).all()
    connection.rollback()
    # LEASED rows are as many as the jobs running at once, whatever the table holds.
    return {index: column for index, column, predicate in rows if predicate != "(status = 'LEASED'::text)"}


def whole_reads(plan: dict[str, Any], leading: dict[str, str]) -> list[str]:
    """Each node of ``plan`` that reads a growing table whole, described."""
    found: list[str] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        kind, table = node["Node Type"], node.get("Relation Name")
        index = node.get("Index Name")
        if kind == "Seq Scan" and table in GROWING:
            found.append(f"Seq Scan on {table}")
        elif kind in SCANS and index in leading:
            condition = node.get("Index Cond", "")
            if not re.search(rf"\b{re.escape(leading[index])}\b", condition):
                found.append(f"{kind} over all of {index} (condition: {condition or 'none'})")
    return found


def described(reads: dict[str, list[str]]) -> str:
    return "\n".join(f"{label}: {'; '.join(found)}" for label, found in reads.items() if found)


@pytest.fixture
def store_connection(engine) -> Iterator[Any]:
    with engine.connect() as connection:
        connection.execute(text("ANALYZE"))
        connection.commit()
        for table in GROWING:
            # Statistics stay those of the empty tables while the rows arrive.
            connection.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        connection.commit()
        yield own(connection, policy_of(engine))


def fill(connection: Any) -> None:
    """ROWS finished jobs, each with its attempt (the statements only ever insert events)."""
    connection.execute(text(
        "INSERT INTO job_definitions (job_type, max_attempts) VALUES ('plans.grow', 1) ON CONFLICT DO NOTHING"))
    connection.execute(text(
        "INSERT INTO job_queue (id, job_type, max_attempts, status, stage, finished_at, attempt, queue) "
        "SELECT gen_random_uuid(), 'plans.grow', 1, 'SUCCEEDED', 'completed', now(), 1, 'default' "
        "FROM generate_series(1, :rows)"), {"rows": ROWS})
    connection.execute(text(
        "INSERT INTO job_attempts (id, job_id, run_number, attempt, worker_id, finished_at) "
        "SELECT gen_random_uuid(), id, 1, 1, 'w', now() FROM job_queue WHERE job_type = 'plans.grow'"))
    connection.commit()


@pytest.mark.timeout(900)
def test_every_prepared_statement_has_a_keyed_plan_made_on_empty_tables_and_kept_at_a_million_rows(store_connection):
    statements = all_prepared_statements()
    assert len(statements) >= 20, [s.label for s in statements]
    leading = leading_columns(store_connection)
    on_empty = {statement.label: whole_reads(kept_plan(store_connection, statement), leading) for statement in statements}
    assert not any(on_empty.values()), described(on_empty)

    fill(store_connection)
    assert store_connection.execute(text("SELECT count(*) FROM job_attempts")).scalar_one() >= ROWS
    store_connection.rollback()
    kept = {statement.label: whole_reads(kept_plan(store_connection, statement), leading) for statement in statements}
    assert not any(kept.values()), described(kept)
