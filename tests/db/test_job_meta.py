"""Job metadata: stored with the job, kept across retries, continuations and requeues, read as ctx.meta."""

from __future__ import annotations

import pytest

import runledger_sync as rl
from runledger_sync import testing
from runledger_sync.core.meta import MAX_META_BYTES, MAX_META_KEY_CHARS, MAX_META_KEYS
from tests.support import scalar

SECRET = "s3cret-token-value"


@pytest.fixture
def seen() -> list:
    return []


@pytest.fixture
def registry(engine, seen) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job("meta.flaky", max_attempts=3)
    def flaky(ctx, payload):
        seen.append((ctx.run_number, ctx.attempt, dict(ctx.meta)))
        if ctx.attempt == 1:
            raise rl.JobFailure.retryable("try.again", "first attempt fails")

    @registry.job("meta.continues")
    def continues(ctx, payload):
        seen.append((ctx.run_number, ctx.attempt, dict(ctx.meta)))
        if ctx.run_number == 1:
            return rl.JobCompletion(continue_after=0)
        return None

    @registry.job("meta.dies", max_attempts=1)
    def dies(ctx, payload):
        seen.append((ctx.run_number, ctx.attempt, dict(ctx.meta)))
        raise rl.JobFailure.terminal("no.luck", "always")

    registry.sync_definitions(engine)
    return registry


def job_count(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


def test_meta_is_stored_returned_and_read_back(engine, registry):
    job = rl.enqueue(engine, "meta.flaky", {"n": 1}, meta={"tenant": "acme", "request_id": "r-1"})

    assert job.meta == {"tenant": "acme", "request_id": "r-1"}
    assert rl.get_job(engine, job.id).meta == {"tenant": "acme", "request_id": "r-1"}
    assert scalar(engine, "SELECT meta FROM job_queue WHERE id = :id", id=job.id) == job.meta
    plain = rl.enqueue(engine, "meta.flaky")
    assert plain.meta == {} and rl.get_job(engine, plain.id).meta == {}


def test_enqueue_many_takes_meta_per_spec(engine, registry):
    jobs = rl.enqueue_many(engine, [rl.JobSpec("meta.flaky", {}, meta={"n": "1"}), rl.JobSpec("meta.flaky", {})])

    assert [job.meta for job in jobs] == [{"n": "1"}, {}]


def test_the_handler_sees_ctx_meta_on_every_retry(engine, registry, seen):
    rl.enqueue(engine, "meta.flaky", {}, meta={"tenant": "acme"})

    result = testing.drain(engine, registry, include_scheduled=True)

    assert result.by_outcome == {"retried": 1, "succeeded": 1}
    assert seen == [(1, 1, {"tenant": "acme"}), (1, 2, {"tenant": "acme"})]


def test_meta_is_kept_by_a_continuation(engine, registry, seen):
    job = rl.enqueue(engine, "meta.continues", {}, meta={"tenant": "acme"})

    testing.drain(engine, registry, include_scheduled=True)

    assert seen == [(1, 1, {"tenant": "acme"}), (2, 1, {"tenant": "acme"})]
    assert rl.get_job(engine, job.id).meta == {"tenant": "acme"}


def test_meta_is_kept_by_a_requeue(engine, registry, seen):
    job = rl.enqueue(engine, "meta.dies", {}, meta={"tenant": "acme"})
    testing.drain(engine, registry)
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED

    rl.requeue_job(engine, job.id)
    testing.drain(engine, registry)

    assert [meta for _, _, meta in seen] == [{"tenant": "acme"}, {"tenant": "acme"}]
    assert rl.get_job(engine, job.id).meta == {"tenant": "acme"}


def test_meta_is_not_part_of_the_idempotency_comparison(engine, registry):
    first = rl.enqueue(engine, "meta.flaky", {"n": 1}, idempotency_key="k", meta={"request_id": "r-1"})
    again = rl.enqueue(engine, "meta.flaky", {"n": 1}, idempotency_key="k", meta={"request_id": "r-2"})

    assert again.id == first.id
    assert again.meta == {"request_id": "r-1"}  # the stored job's, as for every other field
    with pytest.raises(rl.IdempotencyConflict):
        rl.enqueue(engine, "meta.flaky", {"n": 2}, idempotency_key="k", meta={"request_id": "r-1"})


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (["tenant", SECRET], "meta must be a mapping of str keys to str values, got a list"),
        ({"tenant": 42}, "meta['tenant'] must be a str, got an int"),
        ({"tenant": None}, "meta['tenant'] must be a str, got None"),
        ({7: SECRET}, "meta keys must be str, got an int"),
        ({" ": SECRET}, "meta keys must be non-blank, got a blank key"),
        ({"k" * (MAX_META_KEY_CHARS + 1): SECRET}, f"meta keys must be at most {MAX_META_KEY_CHARS} characters, "
                                                   f"got a key of {MAX_META_KEY_CHARS + 1} characters"),
        ({f"k{n}": "v" for n in range(MAX_META_KEYS + 1)}, f"meta must be at most {MAX_META_KEYS} keys, got 33 keys"),
        ({"big": SECRET * 300}, f"meta must be at most {MAX_META_BYTES} bytes of JSON, got 5410 bytes of JSON"),
        ({"nul": SECRET + "\x00"}, "meta must be text jsonb can store, got "),
    ],
)
def test_bad_meta_is_refused_with_its_code_writes_nothing_and_echoes_no_value(engine, registry, meta, message):
    with pytest.raises(rl.InvalidMeta) as raised:
        rl.enqueue(engine, "meta.flaky", {}, meta=meta)

    assert raised.value.code == "job.invalid_meta"
    assert raised.value.message.startswith(message), raised.value.message
    assert SECRET not in raised.value.message
    with pytest.raises(rl.InvalidMeta):
        rl.enqueue_many(engine, [rl.JobSpec("meta.flaky", {}), rl.JobSpec("meta.flaky", {}, meta=meta)])
    assert job_count(engine) == 0


def test_meta_joins_the_callers_transaction(engine, registry):
    with engine.connect() as connection:
        with connection.begin():
            rl.enqueue(connection, "meta.flaky", {}, meta={"tenant": "acme"})
        transaction = connection.begin()
        rl.enqueue(connection, "meta.flaky", {}, meta={"tenant": "gone"})
        transaction.rollback()

    assert [job.meta for job in rl.list_jobs(engine)] == [{"tenant": "acme"}]


def test_a_workflows_meta_is_given_to_each_steps_job(engine, registry, seen):
    workflow = rl.Workflow("meta.flow", meta={"tenant": "acme"})
    first = workflow.job("first", "meta.flaky", {})
    workflow.job("second", "meta.flaky", {}, after=[first])

    run = rl.enqueue_workflow(engine, workflow)
    testing.drain(engine, registry, include_scheduled=True)

    assert run.meta == {"tenant": "acme"} and rl.get_workflow_run(engine, run.id).meta == {"tenant": "acme"}
    assert [meta for _, _, meta in seen] == [{"tenant": "acme"}] * 4
    with pytest.raises(rl.InvalidMeta):
        rl.Workflow("meta.flow", meta={"tenant": 1})
