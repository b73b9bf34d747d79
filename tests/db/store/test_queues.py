"""Queues on a real PostgreSQL: pause, the global limit, rate limits, the claim's queues and rooms, bad settings.

Each rule is read back from the rows a claim leaves (LEASED jobs, attempts)
and, where two claimers race, from two connections claiming at once.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import pytest

import runledger_sync as rl
from runledger_sync.core.errors import RunledgerError
from runledger_sync.registry import JobRegistry
from runledger_sync.store.attempt.ends import complete_job_success
from runledger_sync.store.driver import claim_jobs, claim_prestart_jobs_for_types
from runledger_sync.store.enqueue.enqueue import enqueue, enqueue_many
from runledger_sync.store.queues import configure_queue, get_queue, list_queues, pause_queue, queue_loads, resume_queue
from tests.support import JOB_TYPE, define, identity, rows, scalar, wait_until


@pytest.fixture(autouse=True)
def defined(engine) -> None:
    define(engine)


def claim(engine: Any, limit: int = 50, *, worker_id: str = "w", **kwargs: Any) -> list[Any]:
    return claim_jobs(engine, worker_id=worker_id, lease_ttl_seconds=30, limit=limit, **kwargs)


def jobs_in(engine: Any, queue: str, count: int, **kwargs: Any) -> list[Any]:
    return enqueue_many(engine, [rl.JobSpec(JOB_TYPE, {"n": n}, queue=queue, **kwargs) for n in range(count)])


def leased(engine: Any, queue: str) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'LEASED' AND queue = :q", q=queue)


def succeed_all(engine: Any, jobs: list[Any]) -> None:
    for job in jobs:
        complete_job_success(engine, **identity(job))


def in_parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released together; their results, in order (an exception fails the test)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(n: int) -> None:
        barrier.wait(10)
        try:
            results[n] = calls[n]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.fixture
def second_engine(fresh_database) -> Any:
    engine = rl.create_engine(fresh_database)
    yield engine
    engine.dispose()


# -- pause ----------------------------------------------------------------------------------


def test_a_paused_queue_gives_nothing_enqueue_still_works_and_resume_lets_claims_through(engine):
    configure_queue(engine, "mail")
    running = jobs_in(engine, "mail", 1)
    [claimed] = claim(engine)
    assert claimed.id == running[0].id

    paused = pause_queue(engine, "mail")

    assert paused.paused and paused.paused_at is not None
    waiting = jobs_in(engine, "mail", 3)  # enqueue still works
    plain = enqueue(engine, JOB_TYPE, {"plain": True})
    assert [job.id for job in claim(engine)] == [plain.id]  # other queues are claimed
    assert claim(engine, queues=["mail"]) == []
    succeed_all(engine, [claimed])  # a job running when the pause came finishes
    assert rows(engine, "SELECT status, attempt FROM job_queue WHERE id = ANY(:ids)", ids=[j.id for j in waiting]) == [
        ("PENDING", 0)] * 3

    resumed = resume_queue(engine, "mail")

    assert not resumed.paused and resumed.paused_at is None
    assert sorted(job.id for job in claim(engine)) == sorted(job.id for job in waiting)


def test_an_operators_pause_survives_sync_definitions_which_rewrites_the_limits(engine):
    registry = JobRegistry()
    registry.queue("mail", global_limit=2, rate_limit=rl.RateLimit(10, per_seconds=60))
    registry.job(JOB_TYPE, queue="mail")(lambda ctx, payload: None)
    registry.sync_definitions(engine)
    pause_queue(engine, "mail")
    configure_queue(engine, "mail", global_limit=9, key_limit=3, rate_limit=None)

    registry.sync_definitions(engine)

    mail = get_queue(engine, "mail")
    assert (mail.paused, mail.global_limit, mail.key_limit, mail.rate_limit) == (
        True, 2, 1, rl.RateLimit(10, per_seconds=60))
    # The type joined its queue: its jobs land there.
    assert enqueue(engine, JOB_TYPE, {}).queue == "mail"
    assert [queue.name for queue in list_queues(engine)] == ["default", "mail"]


def test_a_job_type_naming_an_undeclared_queue_is_refused_at_sync_with_a_hint_and_nothing_is_written(engine):
    registry = JobRegistry()
    registry.queue("mail", global_limit=2)
    registry.job("mail.send", queue="mial")(lambda ctx, payload: None)

    with pytest.raises(rl.errors.UndeclaredQueue) as caught:
        registry.sync_definitions(engine)

    error = caught.value
    assert error.code == "registry.undeclared_queue" and isinstance(error, rl.errors.RegistrationError)
    assert "'mail.send'" in error.message and "'mial'" in error.message and "did you mean 'mail'?" in error.message
    assert (error.details["job_type"], error.details["queue"]) == ("mail.send", "mial")
    assert [queue.name for queue in list_queues(engine)] == ["default"]
    assert scalar(engine, "SELECT count(*) FROM job_definitions WHERE job_type = 'mail.send'") == 0


def test_an_undeclared_queue_with_no_near_name_is_refused_without_a_guess(engine):
    registry = JobRegistry()
    registry.job("reports.export", queue="reports")(lambda ctx, payload: None)

    error = assert_code("registry.undeclared_queue", lambda: registry.sync_definitions(engine))

    assert "did you mean" not in error.message and "registry.queue('reports')" in error.message


def test_the_default_queue_and_a_queue_an_operator_created_need_no_declaration(engine):
    configure_queue(engine, "bulk", global_limit=3)
    registry = JobRegistry()
    registry.job("plain")(lambda ctx, payload: None)
    registry.job("bulk.import", queue="bulk")(lambda ctx, payload: None)
    # Declared after the handler that names it: the order does not matter.
    registry.job("mail.send", queue="mail")(lambda ctx, payload: None)
    registry.queue("mail")

    registry.sync_definitions(engine)

    assert [queue.name for queue in list_queues(engine)] == ["bulk", "default", "mail"]
    assert [(r.job_type, r.queue) for r in rows(
        engine, "SELECT job_type, queue FROM job_definitions WHERE job_type IN ('plain', 'bulk.import', 'mail.send') "
                "ORDER BY job_type")] == [("bulk.import", "bulk"), ("mail.send", "mail"), ("plain", "default")]


# -- the claim's queues and rooms ------------------------------------------------------------


def test_queues_restricts_the_claim_and_queue_rooms_caps_it_per_queue(engine):
    configure_queue(engine, "a")
    configure_queue(engine, "b")
    in_a = jobs_in(engine, "a", 5)
    in_b = jobs_in(engine, "b", 5)

    first = claim(engine, 3, queues=["b"])
    assert [job.queue for job in first] == ["b"] * 3
    assert claim(engine, queues=[]) == []
    assert claim(engine, queues=["nowhere"]) == []  # an unknown queue has no jobs
    capped = claim(engine, queue_rooms={"a": 2, "b": 0})
    assert [job.queue for job in capped] == ["a", "a"]
    rest = claim(engine, queue_rooms={"a": 10})
    assert sorted(job.queue for job in rest) == ["a", "a", "a", "b", "b"]
    assert {job.id for job in first + capped + rest} == {job.id for job in in_a + in_b}


# -- global limit ----------------------------------------------------------------------------


def test_the_global_limit_caps_leased_jobs_and_is_reached(engine):
    configure_queue(engine, "g", global_limit=3)
    jobs_in(engine, "g", 8)

    first = claim(engine, 2)
    assert len(first) == 2
    assert len(claim(engine)) == 1 and leased(engine, "g") == 3
    assert claim(engine) == []
    succeed_all(engine, first)
    assert len(claim(engine)) == 2 and leased(engine, "g") == 3
    # A prestart claim counts the same leases.
    assert claim_prestart_jobs_for_types(engine, worker_id="w", lease_ttl_seconds=30, limit=8, job_types=[JOB_TYPE]) == []


def test_two_claimers_at_once_never_lease_more_than_the_global_limit(engine, second_engine):
    configure_queue(engine, "g", global_limit=3)
    jobs_in(engine, "g", 60)
    for _ in range(10):
        mine, theirs = in_parallel(lambda: claim(engine, 8, worker_id="one"),
                                   lambda: claim(second_engine, 8, worker_id="two"))
        # Each round the limit is reached, never passed.
        assert len(mine) + len(theirs) == 3 and leased(engine, "g") == 3
        succeed_all(engine, mine + theirs)


# -- rate limits -----------------------------------------------------------------------------


def test_a_rate_limit_caps_claims_per_window_and_rate_limited_jobs_wait_pending_unspent(engine):
    configure_queue(engine, "r", rate_limit=rl.RateLimit(3, per_seconds=0.5))
    jobs = jobs_in(engine, "r", 7)

    first = claim(engine)
    assert len(first) == 3 and claim(engine) == []
    succeed_all(engine, first)  # finishing gives back no budget: the window does
    assert claim(engine) == []
    assert rows(engine, "SELECT DISTINCT status, attempt FROM job_queue WHERE id = ANY(:ids) AND status <> 'SUCCEEDED'",
                ids=[job.id for job in jobs]) == [("PENDING", 0)]
    assert queue_loads(engine)[-1].rate_used == 3

    second = wait_until(lambda: claim(engine), what="the rate window passes")
    assert len(second) == 3
    # From the claims' own clock: no window of 0.5 s holds more than 3.
    leased_at = [row[0] for row in rows(engine, "SELECT leased_at FROM job_attempts ORDER BY leased_at")]
    assert all((later - earlier).total_seconds() >= 0.5 for earlier, later in zip(leased_at[:-3], leased_at[3:], strict=True))


def test_two_claimers_at_once_share_one_rate_budget(engine, second_engine):
    configure_queue(engine, "r", rate_limit=rl.RateLimit(4, per_seconds=60))
    jobs_in(engine, "r", 20)

    mine, theirs = in_parallel(lambda: claim(engine, 8, worker_id="one"), lambda: claim(second_engine, 8, worker_id="two"))
    assert len(mine) + len(theirs) == 4
    assert in_parallel(lambda: claim(engine, worker_id="one"), lambda: claim(second_engine, worker_id="two")) == [[], []]


def test_a_per_key_rate_limit_gives_each_key_its_own_budget_and_one_claim_cannot_overspend_it(engine):
    configure_queue(engine, "k", key_limit=None, rate_limit=rl.RateLimit(2, per_seconds=60, per_key=True))
    specs = [rl.JobSpec(JOB_TYPE, {"n": n}, queue="k", concurrency_key=key) for key in ("a", "b") for n in range(4)]
    enqueue_many(engine, specs + [rl.JobSpec(JOB_TYPE, {"n": n}, queue="k") for n in range(3)])

    claimed = claim(engine)
    while batch := claim(engine):  # a claim may take fewer than the budgets allow: keep claiming
        claimed += batch

    by_key: dict[Any, int] = {}
    for job in claimed:
        by_key[job.concurrency_key] = by_key.get(job.concurrency_key, 0) + 1
    # Unkeyed jobs share one budget of their own.
    assert by_key == {"a": 2, "b": 2, None: 2}
    assert scalar(engine, "SELECT count(*) FROM job_queue WHERE status = 'PENDING' AND attempt = 0") == 5


# -- bad names and settings ------------------------------------------------------------------


def assert_code(code: str, call: Callable[[], Any]) -> RunledgerError:
    with pytest.raises(RunledgerError) as caught:
        call()
    assert caught.value.code == code, caught.value
    return caught.value


def test_an_unknown_queue_is_queue_not_found_naming_it_and_nothing_is_written(engine):
    error = assert_code("queue.not_found", lambda: enqueue(engine, JOB_TYPE, {"secret": "payload"}, queue="nowhere"))
    assert "nowhere" in error.message and "secret" not in str(error)
    assert error.details.get("queue") == "nowhere"
    assert_code("queue.not_found", lambda: enqueue_many(
        engine, [rl.JobSpec(JOB_TYPE, {}), rl.JobSpec(JOB_TYPE, {}, queue="nowhere")]))
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 0
    for call in (pause_queue, resume_queue, get_queue):
        assert "nowhere" in assert_code("queue.not_found", functools.partial(call, engine, "nowhere")).message
    assert [queue.name for queue in list_queues(engine)] == ["default"]


@pytest.mark.parametrize("settings", [
    {"global_limit": -1}, {"global_limit": 0}, {"global_limit": True}, {"global_limit": 2.5},
    {"key_limit": 0}, {"key_limit": -3}, {"key_limit": False}, {"rate_limit": 5}, {"rate_limit": (5, 1)},
])
def test_bad_queue_settings_are_invalid_setting_and_nothing_is_written(engine, settings):
    assert_code("queue.invalid_setting", lambda: configure_queue(engine, "new", **settings))
    assert_code("queue.invalid_setting", lambda: configure_queue(engine, "default", **settings))
    assert [(q.name, q.global_limit, q.key_limit, q.rate_limit) for q in list_queues(engine)] == [
        ("default", None, 1, None)]


@pytest.mark.parametrize("rate", [(0, 1.0), (-1, 1.0), (True, 1.0), (5, 0), (5, -1.0), (5, float("nan"))])
def test_a_rate_of_nothing_or_over_no_time_is_invalid_setting(rate):
    assert_code("queue.invalid_setting", lambda: rl.RateLimit(*rate))


@pytest.mark.parametrize("name", ["", "   ", "x" * 129, 7])
def test_bad_queue_names_are_invalid_name(engine, name):
    assert_code("queue.invalid_name", lambda: configure_queue(engine, name))
    assert_code("queue.invalid_name", lambda: enqueue(engine, JOB_TYPE, {}, queue=name))
    assert scalar(engine, "SELECT count(*) FROM job_queues") == 1


@pytest.mark.parametrize("key", ["", "  \t", "k" * 513, "é" * 257, 42])
def test_bad_concurrency_keys_are_invalid_and_nothing_is_written(engine, key):
    assert_code("job.invalid_execution_resource_key", lambda: enqueue(engine, JOB_TYPE, {}, concurrency_key=key))
    assert_code("job.invalid_execution_resource_key", lambda: enqueue_many(
        engine, [rl.JobSpec(JOB_TYPE, {}), rl.JobSpec(JOB_TYPE, {}, concurrency_key=key)]))
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 0


def test_a_concurrency_key_of_512_bytes_is_accepted(engine):
    job = enqueue(engine, JOB_TYPE, {}, concurrency_key="é" * 256)
    assert job.concurrency_key == "é" * 256
