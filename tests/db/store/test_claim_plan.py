"""The claim reads the head of the queue in index order, whatever the planner's statistics say.

Every test database is a fresh clone, so its job_queue has never been analyzed:
the state of a new install, and close to that of a table analyzed while idle and
then hit by a burst. With such statistics PostgreSQL would rather fetch every
pending row of the claimed types and sort them, which makes each claim cost in
proportion to the queue. The plan is read with EXPLAIN on the claim's connection,
inside its transaction, just before the claim statement runs, so it sees the same
settings. A claim in a caller's transaction plans the same way and then gives the
caller's planner settings back.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import pytest
from sqlalchemy import event

import runledger_sync as rl
from runledger_sync.store.enqueue.enqueue import enqueue_many
from runledger_sync.store.claim.claim import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.transactions import HeldConnection
from tests.support import JOB_TYPE, define, scalar

QUEUED = 10_000


@pytest.fixture
def queued(engine) -> None:
    define(engine)
    enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": n}) for n in range(QUEUED)])
    assert scalar(engine, "SELECT reltuples FROM pg_class WHERE relname = 'job_queue'") < 0, "table was analyzed"


@pytest.fixture
def claim_plans(engine) -> Iterator[list[dict[str, Any]]]:
    """EXPLAIN's answer for every claim statement run on ``engine``, asked on the claim's own connection."""
    plans: list[dict[str, Any]] = []

    def explain(_conn, cursor, statement, parameters, _context, _executemany) -> None:
        # The plain statement (a caller's transaction), or the prepared one (the store's
        # own), sent after the planner settings in the same query.
        *settings, claim = statement.split("; ")
        if claim.lstrip().startswith(("WITH clock AS", "EXECUTE runledger_claim")):
            # In one query, as the claim sends them: its transaction may be that query alone.
            cursor.execute("; ".join([*settings, "EXPLAIN (FORMAT JSON) " + claim]), parameters)
            explained = cursor.fetchone()[0]
            plans.append((json.loads(explained) if isinstance(explained, str) else explained)[0])

    event.listen(engine, "before_cursor_execute", explain)
    yield plans
    event.remove(engine, "before_cursor_execute", explain)


def pick_scan(plan: dict[str, Any]) -> dict[str, Any]:
    """The node under the pick's LockRows: what the rows to lock are read from."""
    stack = [plan]
    while stack:
        node = stack.pop()
        if node["Node Type"] == "LockRows":
            return node["Plans"][0]
        stack.extend(node.get("Plans", []))
    raise AssertionError("the claim plan has no LockRows node")


def assert_reads_the_claim_index_in_order(explained: list[dict[str, Any]], claims: int = 1) -> None:
    assert len(explained) == claims
    for plan in explained:
        scan = pick_scan(plan["Plan"])
        assert scan["Node Type"] == "Index Scan", f"the pick sorts instead: {scan['Node Type']}"
        assert scan["Index Name"] == "idx_job_queue_claim"
        # Where the server has JIT, a claim compiled by it would take hundreds of milliseconds.
        assert "JIT" not in plan


def prestart_claims_of_eight(engine, claims: int = 1) -> None:
    """Claim 8 jobs ``claims`` times on one held connection, as the polling thread does."""
    held = HeldConnection(engine)
    try:
        for _ in range(claims):
            jobs = claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=8,
                                                           job_types=[JOB_TYPE])
            assert len(jobs) == 8
    finally:
        held.close()


@pytest.mark.usefixtures("queued")
def test_a_prestart_claim_reads_the_claim_index_in_order(engine, claim_plans):
    prestart_claims_of_eight(engine)
    assert_reads_the_claim_index_in_order(claim_plans)


@pytest.mark.usefixtures("queued")
def test_a_prepared_claim_keeps_one_generic_plan_that_reads_the_claim_index_in_order(engine, claim_plans):
    # Planned once per connection, without knowing the job types or the limit.
    prestart_claims_of_eight(engine, claims=3)
    assert_reads_the_claim_index_in_order(claim_plans, claims=3)
    for plan in claim_plans:
        # A generic plan shows the parameters where a custom one shows the values.
        assert "$" in pick_scan(plan["Plan"])["Filter"] and JOB_TYPE not in pick_scan(plan["Plan"])["Filter"]


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def assert_looks_claimed_rows_up_by_id(plan: dict[str, Any]) -> None:
    scans = [n for n in plan_nodes(plan["Plan"]) if n.get("Relation Name") == "job_queue" and "Scan" in n["Node Type"]]
    # The leased-expiry index counts a queue's leases: in the plan, run only for a queue with a global limit.
    assert {n["Index Name"] for n in scans} == {"idx_job_queue_claim", "pk_job_queue", "idx_job_queue_leased_expiry"}
    # Each reads only what its condition finds, never its index whole (the partial
    # leased index holds leased rows only: its condition is its predicate).
    assert all("Index Cond" in n for n in scans if n["Index Name"] != "idx_job_queue_leased_expiry")


@pytest.mark.usefixtures("queued")
def test_a_claim_planned_on_a_long_analyzed_queue_still_looks_its_rows_up_by_id(engine, claim_plans):
    # Not knowing the limit, a plan made once expects a tenth of the queue to be
    # claimed, and would rather read the whole table than look that many up.
    with engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE job_queue")
    prestart_claims_of_eight(engine)
    assert_reads_the_claim_index_in_order(claim_plans)
    assert_looks_claimed_rows_up_by_id(claim_plans[0])


@pytest.mark.parametrize("rows", [1, 8])
def test_a_claim_planned_on_a_nearly_empty_queue_still_looks_its_rows_up_by_id_once_it_is_long(
    engine, claim_plans, rows,
):
    # A new install: the plan is made when the analyzed table holds a row or a few,
    # where reading it whole would be cheapest, and then kept while the queue grows.
    define(engine)
    enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": n}) for n in range(rows)])
    with engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE job_queue")
    held = HeldConnection(engine)
    try:
        assert len(claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=8,
                                                           job_types=[JOB_TYPE])) == rows
        enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": n}) for n in range(QUEUED)])
        assert len(claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=8,
                                                           job_types=[JOB_TYPE])) == 8
    finally:
        held.close()
    assert len(claim_plans) == 2
    assert_looks_claimed_rows_up_by_id(claim_plans[1])


@pytest.mark.usefixtures("queued")
def test_a_direct_claim_for_types_reads_the_claim_index_in_order(engine, claim_plans):
    jobs = claim_jobs(engine, worker_id="w", lease_ttl_seconds=30, limit=8, job_types=[JOB_TYPE, "x.y"])
    assert len(jobs) == 8
    assert_reads_the_claim_index_in_order(claim_plans)


def planner_settings(connection) -> tuple[str, str, str]:
    return tuple(connection.exec_driver_sql(
        "SELECT current_setting('enable_sort'), current_setting('jit'), current_setting('plan_cache_mode')"
    ).one())


@pytest.mark.usefixtures("queued")
def test_the_planner_settings_end_with_the_claims_transaction(engine):
    held = HeldConnection(engine)
    try:
        with held.connect() as connection:
            before = planner_settings(connection)
            connection.rollback()
        assert before[0] == "on"
        claim_prestart_jobs_for_types(held, worker_id="w", lease_ttl_seconds=30, limit=1,
                                                job_types=[JOB_TYPE])
        with held.connect() as connection:
            assert planner_settings(connection) == before
            connection.rollback()
    finally:
        held.close()


@pytest.mark.usefixtures("queued")
def test_a_claim_in_the_callers_transaction_plans_in_order_and_gives_back_its_settings(engine, claim_plans):
    with engine.connect() as connection:
        # The caller's own choices, made before the claim, must be what it finds after it.
        connection.exec_driver_sql("SET LOCAL jit = off")
        connection.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        before = planner_settings(connection)
        assert before == ("on", "off", "force_generic_plan")
        jobs = claim_jobs(connection, worker_id="w", lease_ttl_seconds=30, limit=8, job_types=[JOB_TYPE])
        assert len(jobs) == 8
        assert planner_settings(connection) == before
        connection.commit()
    assert_reads_the_claim_index_in_order(claim_plans)
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED'") == 8


# -- jobs held back by their concurrency key -----------------------------------------------------

HELD_BACK_KEYS = 200
HELD_BACK_PER_KEY = 100


@pytest.fixture
def held_back(engine) -> list[Any]:
    """20,000 PENDING jobs of 200 keys, each key busy with a LEASED head: the rest held back, as the key trigger leaves them.

    The heads are enqueued and claimed; the held-back jobs are written in one
    statement with triggers off (enqueueing them one by one would only be slower).
    """
    define(engine)
    heads = enqueue_many(
        engine, [rl.JobSpec(JOB_TYPE, {"key": n}, concurrency_key=f"customer:{n}") for n in range(HELD_BACK_KEYS)])
    assert len(claim_jobs(engine, worker_id="w", lease_ttl_seconds=300, limit=HELD_BACK_KEYS)) == HELD_BACK_KEYS
    with engine.begin() as connection:
        connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
        connection.exec_driver_sql(
            "INSERT INTO job_queue (id, job_type, max_attempts, queue, execution_resource_key, blocked_by_key) "
            "SELECT gen_random_uuid(), %(type)s, 3, 'default', 'customer:' || (g %% %(keys)s), true "
            "FROM generate_series(1, %(count)s) g",
            {"type": JOB_TYPE, "keys": HELD_BACK_KEYS, "count": HELD_BACK_KEYS * (HELD_BACK_PER_KEY - 1)})
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'PENDING' AND blocked_by_key") == 19_800
    return heads


# job_queue's sequential scans and the entries read from its indexes, so far. The
# counters are the backend's own, not yet reported, which may hold earlier
# transactions' too: only a difference taken inside one transaction is its own.
_READS = (
    "SELECT pg_stat_get_xact_numscans('job_queue'::regclass), sum(pg_stat_get_xact_tuples_returned(indexrelid)) "
    "FROM pg_index WHERE indrelid = 'job_queue'::regclass"
)


def claim_reads(engine, limit: int = 8) -> tuple[list[Any], float, int, int]:
    """A claim in a transaction of ours: its jobs, seconds, and job_queue's sequential scans and index entries read."""
    with engine.connect() as connection:
        scans_before, entries_before = connection.exec_driver_sql(_READS).one()
        started = time.perf_counter()
        jobs = claim_jobs(connection, worker_id="w", lease_ttl_seconds=30, limit=limit, job_types=[JOB_TYPE])
        seconds = time.perf_counter() - started
        scans_after, entries_after = connection.exec_driver_sql(_READS).one()
        connection.commit()
    return jobs, seconds, scans_after - scans_before, entries_after - entries_before


@pytest.mark.parametrize("analyzed", [False, True])
def test_a_claim_among_jobs_held_back_by_busy_keys_reads_the_claim_index_not_them(engine, held_back, claim_plans, analyzed):
    if analyzed:
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE job_queue")
    claim_reads(engine)  # plans and warms up

    jobs, seconds, seq_scans, entries = claim_reads(engine)

    assert jobs == []
    # Not the 19,800 held back: at most the entries the 200 claimed heads left in the
    # claim index, which stay until vacuum (or a scan marks them dead) while another
    # session's snapshot may still see them.
    assert seq_scans == 0 and entries <= 2 * HELD_BACK_KEYS, (seq_scans, entries)
    assert seconds < 0.5, seconds
    assert_reads_the_claim_index_in_order(claim_plans, claims=2)
    for plan in claim_plans:
        assert not [n for n in plan_nodes(plan["Plan"]) if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "job_queue"]

    # Plain jobs among them are found at once.
    plain = enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"plain": n}) for n in range(8)])
    jobs, seconds, seq_scans, entries = claim_reads(engine)
    assert sorted(job.id for job in jobs) == sorted(job.id for job in plain)
    assert seq_scans == 0 and entries <= 2 * HELD_BACK_KEYS + 50 and seconds < 0.5, (seq_scans, entries, seconds)
