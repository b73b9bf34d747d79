"""Every public store function fed bad input: its stable code, and not one row changed.

The cases here add to the tables in tests/db/store/test_enqueue.py (BAD_INPUT)
and tests/db/store/test_admin.py (bad ids and list filters) rather than repeat
them: wrong types, blanks, huge values, non-JSON payloads, the size limit,
unicode (lone surrogates, as argv's surrogateescape makes them) and NUL bytes,
and SQL metacharacters. "Nothing written" is checked on a digest of every row of
every queue table, so an UPDATE is caught as well as an INSERT.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import os
import threading
import uuid
from typing import Any, Callable

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync.core.records import LeaseIdentity
from runledger_sync.store.claim.claim import claim_jobs
from runledger_sync.store.attempt.ends import complete_job_failure
from tests.support import define

JOB_TYPE = "bad.input"
HOSTILE = "x'); DELETE FROM job_queue; --"
SURROGATE = "\udcff"  # what a 0xFF byte in argv becomes under surrogateescape
FOUR_BYTES = "\U0001f600"  # one character, four bytes of UTF-8
UNKNOWN_ID = "00000000-0000-7000-8000-000000000000"
TABLES = ("job_definitions", "job_queue", "job_attempts", "job_events", "job_dead_letters")


def table_digest(engine: Any, tables: tuple[str, ...] = TABLES) -> dict[str, tuple[int, str]]:
    """Row count and an md5 over every row's text, per queue table."""
    digest = {}
    with engine.connect() as conn:
        for table in tables:  # constants, never input
            row = conn.execute(
                text(f"SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM {table} t")  # noqa: S608 - fixed table names
            ).one()
            digest[table] = (row[0], row[1])
    return digest


@pytest.fixture(scope="module")
def module_engine(pg_server, template_database):
    # One database for the whole table: every case must leave it unchanged,
    # which each test checks, so sharing it cannot hide a write.
    name = f"rl_bad_input_{os.getpid()}"
    engine = rl.create_engine(pg_server.create_database(name, template=template_database, drop_existing=True))
    yield engine
    engine.dispose()
    pg_server.drop_database(name)


@pytest.fixture(scope="module")
def module_seed(module_engine):
    return _seed(module_engine)


@pytest.fixture
def seeded(module_seed):
    return module_seed


def _seed(engine: Any) -> dict[str, Any]:
    """One definition, one PENDING job in org-a and one DEAD_LETTERED job, committed."""
    define(engine, JOB_TYPE, max_attempts=1)
    pending = rl.enqueue(engine, JOB_TYPE, {"n": 1}, organization_id="org-a")
    dead = rl.enqueue(engine, JOB_TYPE, {"n": 2}, priority=1_000_000)
    claimed = claim_jobs(engine, worker_id="seed", lease_ttl_seconds=60, limit=1, job_types=[JOB_TYPE])
    assert [job.id for job in claimed] == [dead.id]
    complete_job_failure(engine, **LeaseIdentity.of(claimed[0]).keywords(),
                         failure=rl.JobFailure.terminal("seed.failed", "seeded"), retry_delay_ms=None)
    return {"engine": engine, "pending": pending.id, "dead": dead.id}


@pytest.fixture
def own_seed(engine):
    """The same seed in a database of the test's own, for tests that write."""
    return _seed(engine)


def deeply_nested(depth: int) -> Any:
    return functools.reduce(lambda inner, _: [inner], range(depth), [])


Call = Callable[[Any, dict], Any]


def enq(*args: Any, **kwargs: Any) -> Call:
    return lambda engine, ids: rl.enqueue(engine, *args, **kwargs)


# (case id, call, expected code). Each call gets the engine and the seeded ids.
CASES: list[tuple[str, Call, str]] = [
    # -- enqueue: payloads that are not JSON values
    ("enqueue-payload-bytes", enq(JOB_TYPE, b"raw"), "job.invalid_payload"),
    ("enqueue-payload-bytearray", enq(JOB_TYPE, {"b": bytearray(b"x")}), "job.invalid_payload"),
    ("enqueue-payload-frozenset", enq(JOB_TYPE, frozenset({1})), "job.invalid_payload"),
    ("enqueue-payload-decimal", enq(JOB_TYPE, {"x": decimal.Decimal("1.5")}), "job.invalid_payload"),
    ("enqueue-payload-datetime", enq(JOB_TYPE, {"at": dt.datetime(2030, 1, 1)}), "job.invalid_payload"),
    ("enqueue-payload-uuid", enq(JOB_TYPE, {"id": uuid.uuid4()}), "job.invalid_payload"),
    ("enqueue-payload-function", enq(JOB_TYPE, {"f": len}), "job.invalid_payload"),
    ("enqueue-payload-tuple-key", enq(JOB_TYPE, {(1, 2): "x"}), "job.invalid_payload"),
    ("enqueue-payload-inf", enq(JOB_TYPE, [float("inf")]), "job.invalid_payload"),
    ("enqueue-payload-minus-inf", enq(JOB_TYPE, -float("inf")), "job.invalid_payload"),
    ("enqueue-payload-nan-scalar", enq(JOB_TYPE, float("nan")), "job.invalid_payload"),
    ("enqueue-payload-too-deep", enq(JOB_TYPE, deeply_nested(5_000)), "job.invalid_payload"),
    ("enqueue-payload-surrogate-value", enq(JOB_TYPE, {"s": "a" + SURROGATE}), "job.invalid_payload"),
    ("enqueue-payload-surrogate-key", enq(JOB_TYPE, {"\ud800": 1}), "job.invalid_payload"),
    ("enqueue-payload-nul-key", enq(JOB_TYPE, {"k\x00": 1}), "job.invalid_payload"),
    ("enqueue-payload-nul-deep", enq(JOB_TYPE, {"a": [{"b": ["\x00"]}]}), "job.invalid_payload"),
    # -- enqueue: what json.dumps writes but jsonb would lose or cannot hold
    ("enqueue-payload-huge-int", enq(JOB_TYPE, {"n": 10**5000}), "job.invalid_payload"),
    ("enqueue-payload-int-4301-digits", enq(JOB_TYPE, [-(10**4300)]), "job.invalid_payload"),
    ("enqueue-payload-nested-10000", enq(JOB_TYPE, deeply_nested(10_000)), "job.invalid_payload"),
    ("enqueue-payload-int-key-merges", enq(JOB_TYPE, {1: "a", "1": "b"}), "job.invalid_payload"),
    ("enqueue-payload-none-key-merges", enq(JOB_TYPE, {None: "x", "null": "y"}), "job.invalid_payload"),
    ("enqueue-payload-bool-key", enq(JOB_TYPE, {True: 1}), "job.invalid_payload"),
    ("enqueue-payload-float-key", enq(JOB_TYPE, {1.5: 1}), "job.invalid_payload"),
    ("enqueue-payload-int-key-deep", enq(JOB_TYPE, {"a": [{"b": {2: "x"}}]}), "job.invalid_payload"),
    # -- enqueue: the size limit, default and configured
    ("enqueue-payload-over-default-1mib", enq(JOB_TYPE, "x" * 1_048_576), "job.invalid_payload"),
    ("enqueue-payload-one-byte-over", enq(JOB_TYPE, "x" * 9, max_payload_bytes=10), "job.invalid_payload"),
    ("enqueue-payload-multibyte-over", enq(JOB_TYPE, "é" * 5, max_payload_bytes=11), "job.invalid_payload"),
    ("enqueue-max-payload-bytes-zero", enq(JOB_TYPE, {}, max_payload_bytes=0), "job.invalid_argument"),
    ("enqueue-max-payload-bytes-str", enq(JOB_TYPE, {}, max_payload_bytes="10"), "job.invalid_argument"),
    ("enqueue-max-payload-bytes-none", enq(JOB_TYPE, {}, max_payload_bytes=None), "job.invalid_argument"),
    ("enqueue-max-payload-bytes-bool", enq(JOB_TYPE, {}, max_payload_bytes=True), "job.invalid_argument"),
    # -- enqueue: job types, organization ids and keys
    ("enqueue-type-none", enq(None, {}), "job.invalid_job_type"),
    ("enqueue-type-bytes", enq(JOB_TYPE.encode(), {}), "job.invalid_job_type"),
    ("enqueue-type-surrogate", enq("t." + SURROGATE, {}), "job.invalid_job_type"),
    ("enqueue-type-tabs-only", enq("\t\n", {}), "job.invalid_job_type"),
    ("enqueue-type-sql-unknown", enq(HOSTILE, {}), "job.definition_not_found_or_disabled"),
    ("enqueue-type-like-wildcard", enq("bad.%", {}), "job.definition_not_found_or_disabled"),
    ("enqueue-org-int", enq(JOB_TYPE, {}, organization_id=7), "job.invalid_argument"),
    ("enqueue-org-uuid", enq(JOB_TYPE, {}, organization_id=uuid.uuid4()), "job.invalid_argument"),
    ("enqueue-org-nul", enq(JOB_TYPE, {}, organization_id="org\x00"), "job.invalid_argument"),
    ("enqueue-org-surrogate", enq(JOB_TYPE, {}, organization_id=SURROGATE), "job.invalid_argument"),
    ("enqueue-org-too-long", enq(JOB_TYPE, {}, organization_id="o" * 256), "job.invalid_argument"),
    ("enqueue-key-int", enq(JOB_TYPE, {}, idempotency_key=1), "job.invalid_argument"),
    ("enqueue-key-nul", enq(JOB_TYPE, {}, idempotency_key="k\x00"), "job.invalid_argument"),
    ("enqueue-key-surrogate", enq(JOB_TYPE, {}, idempotency_key=SURROGATE), "job.invalid_argument"),
    ("enqueue-type-10000-characters", enq("t" * 10_000, {}), "job.invalid_job_type"),
    ("enqueue-org-10000-characters", enq(JOB_TYPE, {}, organization_id="o" * 10_000), "job.invalid_argument"),
    ("enqueue-key-10000-characters", enq(JOB_TYPE, {}, idempotency_key="k" * 10_000), "job.invalid_argument"),
    # Within the character limits, over the byte limits the idempotency index needs.
    ("enqueue-org-4-byte-over-bytes", enq(JOB_TYPE, {}, organization_id=FOUR_BYTES * 129), "job.invalid_argument"),
    ("enqueue-key-4-byte-over-bytes", enq(JOB_TYPE, {}, idempotency_key=FOUR_BYTES * 257), "job.invalid_argument"),
    ("enqueue-org-and-key-4-byte-limits", enq(JOB_TYPE, {}, organization_id=FOUR_BYTES * 255,
                                              idempotency_key=FOUR_BYTES * 512), "job.invalid_argument"),
    # -- enqueue: numbers and times of the wrong kind
    ("enqueue-priority-float", enq(JOB_TYPE, {}, priority=1.0), "job.invalid_argument"),
    ("enqueue-priority-huge", enq(JOB_TYPE, {}, priority=2**63), "job.invalid_argument"),
    ("enqueue-priority-10-pow-5000", enq(JOB_TYPE, {}, priority=10**5000), "job.invalid_argument"),
    ("enqueue-max-attempts-str", enq(JOB_TYPE, {}, max_attempts="3"), "job.invalid_argument"),
    ("enqueue-timeout-float", enq(JOB_TYPE, {}, timeout_seconds=1.5), "job.invalid_argument"),
    ("enqueue-delay-bool", enq(JOB_TYPE, {}, delay_seconds=True), "job.invalid_argument"),
    ("enqueue-delay-nan", enq(JOB_TYPE, {}, delay_seconds=float("nan")), "job.invalid_argument"),
    ("enqueue-delay-huge", enq(JOB_TYPE, {}, delay_seconds=1e300), "job.invalid_argument"),
    ("enqueue-delay-str", enq(JOB_TYPE, {}, delay_seconds="5"), "job.invalid_argument"),
    ("enqueue-run-at-date", enq(JOB_TYPE, {}, run_at=dt.date(2030, 1, 1)), "job.invalid_argument"),
    ("enqueue-run-at-epoch", enq(JOB_TYPE, {}, run_at=1_900_000_000), "job.invalid_argument"),
    ("enqueue-stage-unknown", enq(JOB_TYPE, {}, stage="running' OR '1'='1"), "job.invalid_argument"),
    ("enqueue-stage-int", enq(JOB_TYPE, {}, stage=3), "job.invalid_argument"),
    ("enqueue-bind-none", lambda engine, ids: rl.enqueue(None, JOB_TYPE, {}), "job.invalid_argument"),
    ("enqueue-bind-url", lambda engine, ids: rl.enqueue("postgresql://x/y", JOB_TYPE, {}), "job.invalid_argument"),
    # -- enqueue_many: the batch is all or nothing
    ("many-none", lambda engine, ids: rl.enqueue_many(engine, None), "job.invalid_argument"),
    ("many-str", lambda engine, ids: rl.enqueue_many(engine, JOB_TYPE), "job.invalid_argument"),
    ("many-bare-spec", lambda engine, ids: rl.enqueue_many(engine, rl.JobSpec(JOB_TYPE)), "job.invalid_argument"),
    ("many-dict-item", lambda engine, ids: rl.enqueue_many(engine, [{"job_type": JOB_TYPE}]), "job.invalid_argument"),
    ("many-good-then-bad-payload",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"ok": 1}), rl.JobSpec(JOB_TYPE, {1, 2})]),
     "job.invalid_payload"),
    ("many-good-then-bad-stage",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE), rl.JobSpec(JOB_TYPE, stage="nope")]),
     "job.invalid_argument"),
    ("many-good-then-unknown-type",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE), rl.JobSpec(HOSTILE)]),
     "job.definition_not_found_or_disabled"),
    ("many-good-then-int-key",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"ok": 1}), rl.JobSpec(JOB_TYPE, {1: "a"})]),
     "job.invalid_payload"),
    ("many-good-then-key-over-bytes",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE, idempotency_key="k1"),
                                                  rl.JobSpec(JOB_TYPE, idempotency_key=FOUR_BYTES * 300)]),
     "job.invalid_argument"),
    ("many-over-limit",
     lambda engine, ids: rl.enqueue_many(engine, [rl.JobSpec(JOB_TYPE, "x" * 100)], max_payload_bytes=50),
     "job.invalid_payload"),
    # -- reads: ids and scopes
    ("get-id-empty", lambda engine, ids: rl.get_job(engine, ""), "job.invalid_argument"),
    ("get-id-sql", lambda engine, ids: rl.get_job(engine, f"{UNKNOWN_ID}' OR '1'='1"), "job.invalid_argument"),
    ("get-id-float", lambda engine, ids: rl.get_job(engine, 1.0), "job.invalid_argument"),
    ("get-org-int", lambda engine, ids: rl.get_job(engine, ids["pending"], organization_id=1), "job.invalid_argument"),
    ("get-org-blank", lambda engine, ids: rl.get_job(engine, ids["pending"], organization_id=""), "job.invalid_argument"),
    ("get-org-nul", lambda engine, ids: rl.get_job(engine, ids["pending"], organization_id="org-a\x00"),
     "job.invalid_argument"),
    ("get-org-surrogate", lambda engine, ids: rl.get_job(engine, ids["pending"], organization_id=SURROGATE),
     "job.invalid_argument"),
    ("list-status-sql", lambda engine, ids: rl.list_jobs(engine, status="PENDING' OR '1'='1"), "job.invalid_argument"),
    ("list-status-int", lambda engine, ids: rl.list_jobs(engine, status=1), "job.invalid_argument"),
    ("list-status-list", lambda engine, ids: rl.list_jobs(engine, status=["PENDING"]), "job.invalid_argument"),
    ("list-type-nul", lambda engine, ids: rl.list_jobs(engine, job_type="bad\x00"), "job.invalid_job_type"),
    ("list-type-surrogate", lambda engine, ids: rl.list_jobs(engine, job_type=SURROGATE), "job.invalid_job_type"),
    ("list-type-too-long", lambda engine, ids: rl.list_jobs(engine, job_type="t" * 10_000), "job.invalid_job_type"),
    ("list-org-surrogate", lambda engine, ids: rl.list_jobs(engine, organization_id=SURROGATE), "job.invalid_argument"),
    ("list-org-4-byte-over-bytes", lambda engine, ids: rl.list_jobs(engine, organization_id=FOUR_BYTES * 129),
     "job.invalid_argument"),
    ("list-limit-huge", lambda engine, ids: rl.list_jobs(engine, limit=10**12), "job.invalid_argument"),
    ("list-limit-none", lambda engine, ids: rl.list_jobs(engine, limit=None), "job.invalid_argument"),
    ("list-offset-huge", lambda engine, ids: rl.list_jobs(engine, offset=2**40), "job.invalid_argument"),
    ("count-status-dict", lambda engine, ids: rl.count_jobs(engine, status={}), "job.invalid_argument"),
    ("count-type-surrogate", lambda engine, ids: rl.count_jobs(engine, job_type=SURROGATE), "job.invalid_job_type"),
    ("count-org-nul", lambda engine, ids: rl.count_jobs(engine, organization_id="\x00"), "job.invalid_argument"),
    ("stats-org-int", lambda engine, ids: rl.queue_stats(engine, organization_id=1), "job.invalid_argument"),
    ("stats-org-blank", lambda engine, ids: rl.queue_stats(engine, organization_id=" "), "job.invalid_argument"),
    ("stats-org-surrogate", lambda engine, ids: rl.queue_stats(engine, organization_id=SURROGATE),
     "job.invalid_argument"),
    ("attempts-id-none", lambda engine, ids: rl.list_attempts(engine, None), "job.invalid_argument"),
    ("events-id-int", lambda engine, ids: rl.list_events(engine, 5), "job.invalid_argument"),
    ("dead-letter-id-bytes", lambda engine, ids: rl.get_dead_letter(engine, ids["dead"].bytes), "job.invalid_argument"),
    ("dead-letters-since-naive", lambda engine, ids: rl.list_dead_letters(engine, since=dt.datetime(2020, 1, 1)),
     "job.invalid_argument"),
    ("dead-letters-since-str", lambda engine, ids: rl.list_dead_letters(engine, since="2020-01-01"),
     "job.invalid_argument"),
    ("dead-letters-limit-zero", lambda engine, ids: rl.list_dead_letters(engine, limit=0), "job.invalid_argument"),
    ("dead-letters-type-blank", lambda engine, ids: rl.list_dead_letters(engine, job_type=""), "job.invalid_job_type"),
    ("dead-letters-org-surrogate", lambda engine, ids: rl.list_dead_letters(engine, organization_id=SURROGATE),
     "job.invalid_argument"),
    # -- mutations: cancel and requeue
    ("cancel-id-bad", lambda engine, ids: rl.cancel_job(engine, "not-a-uuid"), "job.invalid_argument"),
    ("cancel-unknown-id", lambda engine, ids: rl.cancel_job(engine, UNKNOWN_ID), "job.not_found"),
    ("cancel-finished", lambda engine, ids: rl.cancel_job(engine, ids["dead"]), "job.invalid_state_transition"),
    ("cancel-reason-int", lambda engine, ids: rl.cancel_job(engine, ids["pending"], reason=5), "job.invalid_argument"),
    ("cancel-reason-blank", lambda engine, ids: rl.cancel_job(engine, ids["pending"], reason="  "),
     "job.invalid_argument"),
    ("cancel-reason-nul", lambda engine, ids: rl.cancel_job(engine, ids["pending"], reason="dup\x00"),
     "job.invalid_argument"),
    ("cancel-reason-huge", lambda engine, ids: rl.cancel_job(engine, ids["pending"], reason="r" * 100_000),
     "job.invalid_argument"),
    ("cancel-org-surrogate", lambda engine, ids: rl.cancel_job(engine, ids["pending"], organization_id=SURROGATE),
     "job.invalid_argument"),
    ("cancel-org-sql", lambda engine, ids: rl.cancel_job(engine, ids["pending"], organization_id="x' OR '1'='1"),
     "job.not_found"),
    ("requeue-id-bad", lambda engine, ids: rl.requeue_job(engine, 42), "job.invalid_argument"),
    ("requeue-unknown-id", lambda engine, ids: rl.requeue_job(engine, UNKNOWN_ID), "job.not_found"),
    ("requeue-pending", lambda engine, ids: rl.requeue_job(engine, ids["pending"]), "job.invalid_state_transition"),
    ("requeue-reason-surrogate", lambda engine, ids: rl.requeue_job(engine, ids["dead"], reason=SURROGATE),
     "job.invalid_argument"),
    ("requeue-org-list", lambda engine, ids: rl.requeue_job(engine, ids["dead"], organization_id=["org-a"]),
     "job.invalid_argument"),
    ("requeue-org-sql", lambda engine, ids: rl.requeue_job(engine, ids["dead"], organization_id="') OR true --"),
     "job.not_found"),
    # -- definitions
    ("enable-type-blank", lambda engine, ids: rl.set_job_definition_enabled(engine, "", True), "job.invalid_job_type"),
    ("enable-type-unknown", lambda engine, ids: rl.set_job_definition_enabled(engine, HOSTILE, False),
     "job.definition_not_found_or_disabled"),
    ("enable-flag-str", lambda engine, ids: rl.set_job_definition_enabled(engine, JOB_TYPE, "no"),
     "job.invalid_argument"),
    ("enable-flag-none", lambda engine, ids: rl.set_job_definition_enabled(engine, JOB_TYPE, None),
     "job.invalid_argument"),
    ("enable-flag-int", lambda engine, ids: rl.set_job_definition_enabled(engine, JOB_TYPE, 0),
     "job.invalid_argument"),
]


@pytest.mark.parametrize(("call", "code"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_gets_its_stable_code_and_changes_no_row(seeded, call, code):
    engine = seeded["engine"]
    before = table_digest(engine)

    with pytest.raises(rl.RunledgerError) as caught:
        call(engine, seeded)

    assert caught.value.code == code, caught.value
    # Refused before any SQL: rejected input is a ValidationError; the rest are state checks.
    if code.startswith(("job.invalid_argument", "job.invalid_job_type", "job.invalid_payload")):
        assert isinstance(caught.value, rl.ValidationError)
    assert table_digest(engine) == before


def test_case_ids_are_unique():
    names = [case[0] for case in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("payload", "limit"),
    [("x" * 8, 10), ("é" * 4, 10), ({"a": [1, 2]}, len('{"a":[1,2]}'))],
    ids=["ascii", "two-byte", "object"],
)
def test_payload_exactly_at_the_limit_is_accepted(own_seed, payload, limit):
    # The limit counts UTF-8 bytes of the compact JSON; the boundary itself is allowed.
    job = rl.enqueue(own_seed["engine"], JOB_TYPE, payload, max_payload_bytes=limit)
    assert rl.get_job(own_seed["engine"], job.id).payload == payload


@pytest.mark.parametrize(
    "payload",
    [
        {"text": "\\u0000 is how JSON spells NUL"},  # a backslash, then "u0000": plain text
        {"emoji": "😀", "rtl": "שלום", "combining": "e\u0301", "bom": "\ufeff"},
        {HOSTILE: "'; DROP TABLE job_events; --", "like": "%_\\"},
        deeply_nested(200),
    ],
    ids=["spelled-nul", "unicode", "sql-metacharacters", "nested-200"],
)
def test_awkward_but_valid_payloads_round_trip(own_seed, payload):
    job = rl.enqueue(own_seed["engine"], JOB_TYPE, payload)
    assert rl.get_job(own_seed["engine"], job.id).payload == payload


def test_identifiers_at_every_limit_in_four_byte_characters_are_stored_and_deduplicated(own_seed):
    # The worst idempotency index row: job_type at 255 characters of 4 bytes, and
    # organization_id and idempotency_key at their byte limits (512 and 1024).
    engine = own_seed["engine"]
    job_type = FOUR_BYTES * 255
    organization, key = FOUR_BYTES * 128, FOUR_BYTES * 256
    define(engine, job_type)

    first = rl.enqueue(engine, job_type, {}, organization_id=organization, idempotency_key=key)
    again = rl.enqueue(engine, job_type, {}, organization_id=organization, idempotency_key=key)

    assert again.id == first.id
    stored = rl.get_job(engine, first.id, organization_id=organization)
    assert (stored.job_type, stored.organization_id, stored.idempotency_key) == (job_type, organization, key)


@pytest.mark.parametrize(
    ("job_type", "organization"),
    [("\U0001f4e6.send", "\U0001f3e2-\u00e9"), (HOSTILE, "'; DROP TABLE job_queue; --")],
    ids=["emoji", "sql-looking"],
)
def test_emoji_and_sql_looking_identifiers_are_data(own_seed, job_type, organization):
    engine = own_seed["engine"]
    define(engine, job_type)
    job = rl.enqueue(engine, job_type, {"k": job_type}, organization_id=organization, idempotency_key=organization)
    assert [found.id for found in rl.list_jobs(engine, job_type=job_type, organization_id=organization)] == [job.id]


def test_ints_up_to_4300_digits_round_trip(own_seed):
    payload = {"big": 10**4299, "negative": -(10**4299) + 1}
    job = rl.enqueue(own_seed["engine"], JOB_TYPE, payload)
    assert rl.get_job(own_seed["engine"], job.id).payload == payload


def test_a_20_mb_payload_is_stored_under_a_raised_limit(own_seed):
    payload = {"blob": "x" * 20_000_000, "tail": [1, 2, 3]}
    job = rl.enqueue(own_seed["engine"], JOB_TYPE, payload, max_payload_bytes=21_000_000)
    assert rl.get_job(own_seed["engine"], job.id).payload == payload


def test_sql_metacharacters_in_filters_are_data(own_seed):
    engine = own_seed["engine"]
    define(engine, HOSTILE)
    hostile = rl.enqueue(engine, HOSTILE, {}, organization_id=HOSTILE)
    before = table_digest(engine)

    assert [job.id for job in rl.list_jobs(engine, job_type=HOSTILE)] == [hostile.id]
    assert [job.id for job in rl.list_jobs(engine, organization_id=HOSTILE)] == [hostile.id]
    assert rl.count_jobs(engine, organization_id="org-a' OR '1'='1") == 0
    assert rl.list_jobs(engine, job_type="%") == []
    assert rl.list_dead_letters(engine, job_type="bad.%") == []
    assert rl.queue_stats(engine, organization_id="' OR 1=1 --").by_status["PENDING"] == 0
    assert table_digest(engine) == before


def test_worker_loop_with_an_invalid_config_claims_nothing(own_seed):
    engine = own_seed["engine"]
    registry = rl.JobRegistry()
    registry.job(JOB_TYPE)(lambda ctx, payload: None)
    before = table_digest(engine)
    result: list[Any] = []
    config = rl.JobsConfig(claim_batch_size=0, poll_interval_ms=10)
    worker = threading.Thread(target=lambda: result.append(rl.run_worker_loop(engine, registry, config, threading.Event())))

    worker.start()
    worker.join(20)

    assert not worker.is_alive()
    assert result == [rl.RuntimeLoopExit.INVALID_CONFIG]
    assert table_digest(engine) == before
