"""Middleware around every attempt's handler, and enqueue hooks that add metadata."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import pytest
from sqlalchemy import text

import runledger_sync as rl
from runledger_sync import testing
from tests.support import rows, scalar


class Declined(Exception):
    pass


@pytest.fixture
def calls() -> list:
    return []


@pytest.fixture
def registry(engine, calls) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job("mw.ok", max_attempts=2, retry_on=(Declined,))
    def ok(ctx, payload):
        calls.append(("handler", dict(ctx.meta), payload))
        if payload.get("raise") == "value":
            raise ValueError("handler bug")

    registry.sync_definitions(engine)
    return registry


def only_job(engine) -> rl.JobRecord:
    (job,) = rl.list_jobs(engine)
    return job


def test_middleware_runs_outermost_first_in_registration_order_around_the_handler(engine, registry, calls):
    for name in ("outer", "inner"):
        def middleware(ctx, payload, call_next, name=name):
            calls.append((f"{name} before", ctx.meta["tenant"]))
            result = call_next(ctx, payload)
            calls.append((f"{name} after", result))
            return result
        assert registry.middleware(middleware) is middleware
    rl.enqueue(engine, "mw.ok", {"n": 1}, meta={"tenant": "acme"})

    assert testing.drain(engine, registry).by_outcome == {"succeeded": 1}

    assert calls == [("outer before", "acme"), ("inner before", "acme"), ("handler", {"tenant": "acme"}, {"n": 1}),
                     ("inner after", None), ("outer after", None)]


def test_what_a_middleware_returns_is_the_outcome_and_it_may_skip_the_handler(engine, registry, calls):
    @registry.middleware
    def short_circuit(ctx, payload, call_next):
        return rl.JobCompletion(output={"skipped": True})

    rl.enqueue(engine, "mw.ok", {})
    testing.drain(engine, registry)

    job = only_job(engine)
    assert (job.status, job.output) == (rl.JobStatus.SUCCEEDED, {"skipped": True})
    assert calls == []


def test_a_middleware_may_change_the_payload_the_handler_gets(engine, registry, calls):
    @registry.middleware
    def enrich(ctx, payload, call_next):
        return call_next(ctx, {**payload, "added": ctx.meta.get("tenant")})

    rl.enqueue(engine, "mw.ok", {"n": 1}, meta={"tenant": "acme"})
    testing.drain(engine, registry)

    assert calls == [("handler", {"tenant": "acme"}, {"n": 1, "added": "acme"})]


@pytest.mark.parametrize(
    ("raised", "status", "code"),
    [
        (rl.JobFailure.retryable("mw.busy", "later"), rl.JobStatus.PENDING, "mw.busy"),
        (rl.JobFailure.terminal("mw.refused", "never"), rl.JobStatus.DEAD_LETTERED, "mw.refused"),
        (Declined("retry_on"), rl.JobStatus.PENDING, "job.handler_exception"),
        (KeyError("bug"), rl.JobStatus.DEAD_LETTERED, "job.handler_panic"),
    ],
)
def test_what_a_middleware_raises_is_the_outcome_under_the_handlers_rules(engine, registry, calls, raised, status, code):
    @registry.middleware
    def failing(ctx, payload, call_next):
        raise raised

    rl.enqueue(engine, "mw.ok", {})
    testing.drain(engine, registry)

    job = only_job(engine)
    assert (job.status, job.last_error_code) == (status, code)
    assert calls == []
    if code == "job.handler_panic":
        assert rl.list_attempts(engine, job.id)[0].error_type == "KeyError"


def test_a_middleware_sees_the_handlers_exception_and_may_turn_it_into_another_outcome(engine, registry, calls):
    @registry.middleware
    def translate(ctx, payload, call_next):
        try:
            return call_next(ctx, payload)
        except ValueError as error:
            calls.append(("middleware saw", type(error).__name__))
            raise rl.JobFailure.terminal("mw.translated", "the handler failed") from error

    rl.enqueue(engine, "mw.ok", {"raise": "value"})
    testing.drain(engine, registry)

    assert calls[-1] == ("middleware saw", "ValueError")
    assert only_job(engine).last_error_code == "mw.translated"


def test_call_next_with_another_jobs_context_is_refused_as_a_panic(engine, registry, calls):
    other = rl.JobContext(job_id=rl.enqueue(engine, "mw.ok", {}).id, run_number=1, attempt=1, organization_id=None,
                          worker_id="someone-else")

    @registry.middleware
    def borrow(ctx, payload, call_next):
        return call_next(other, payload)

    testing.drain(engine, registry)

    assert only_job(engine).last_error_code == "job.handler_panic"
    assert calls == []


_transaction = threading.local()


def test_a_middleware_opens_the_transaction_the_handler_writes_and_completes_in(engine, calls):
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE app_notes (job_id uuid PRIMARY KEY, tenant text NOT NULL)"))
    registry = rl.JobRegistry()

    @registry.middleware
    def in_a_transaction(ctx, payload, call_next):
        with engine.begin() as connection:
            _transaction.connection = connection
            try:
                return call_next(ctx, payload)
            finally:
                del _transaction.connection

    @registry.job("mw.note", max_attempts=1)
    def note(ctx, payload):
        connection = _transaction.connection
        connection.execute(text("INSERT INTO app_notes VALUES (:id, :tenant)"),
                           {"id": ctx.job_id, "tenant": ctx.meta["tenant"]})
        if payload.get("fail"):
            raise rl.JobFailure.terminal("note.failed", "after writing")
        ctx.complete_in(connection, rl.JobCompletion(output={"noted": True}))

    registry.sync_definitions(engine)
    kept = rl.enqueue(engine, "mw.note", {}, meta={"tenant": "acme"})
    undone = rl.enqueue(engine, "mw.note", {"fail": True}, meta={"tenant": "acme"})

    testing.drain(engine, registry)

    assert rl.get_job(engine, kept.id).output == {"noted": True}
    assert rl.get_job(engine, undone.id).status is rl.JobStatus.DEAD_LETTERED
    # The failed job's write rolled back with the middleware's transaction.
    assert [tuple(row) for row in rows(engine, "SELECT job_id, tenant FROM app_notes")] == [(kept.id, "acme")]


def test_a_wrapped_registrys_middleware_runs_inside_its_surroundings(engine, registry, calls):
    inside = threading.local()

    @contextlib.contextmanager
    def around() -> Iterator[None]:
        inside.depth = getattr(inside, "depth", 0) + 1
        try:
            yield
        finally:
            inside.depth -= 1

    @registry.middleware
    def depth(ctx, payload, call_next):
        calls.append(("middleware depth", inside.depth))
        return call_next(ctx, payload)

    rl.enqueue(engine, "mw.ok", {})
    testing.drain(engine, registry.wrapped(around))

    assert calls[0] == ("middleware depth", 1)


# -- enqueue hooks ------------------------------------------------------------------


def test_on_enqueue_hooks_add_meta_through_the_registry_and_the_callers_keys_win(engine, registry):
    seen: list[Any] = []

    @registry.on_enqueue
    def tenant(spec):
        seen.append((spec.job_type, spec.payload, dict(spec.meta or {})))
        return {"tenant": "from-hook", "source": "web"}

    registry.on_enqueue(lambda spec: {"source": "later-hook", "hooks": str(len(seen))})

    job = registry.enqueue(engine, "mw.ok", {"n": 1}, meta={"tenant": "acme"})
    many = registry.enqueue_many(engine, (rl.JobSpec("mw.ok", {"n": n}) for n in (2, 3)))

    assert job.meta == {"tenant": "acme", "source": "web", "hooks": "1"}
    assert [j.meta for j in many] == [{"tenant": "from-hook", "source": "web", "hooks": str(n)} for n in (2, 3)]
    assert seen[0] == ("mw.ok", {"n": 1}, {"tenant": "acme"})
    # A plain enqueue knows no registry: no hook runs.
    assert rl.enqueue(engine, "mw.ok", {}).meta == {}
    assert len(seen) == 3


def test_an_enqueue_hook_that_fails_or_returns_no_mapping_writes_nothing(engine, registry):
    registry.on_enqueue(lambda spec: ["not", "a", "mapping"])

    with pytest.raises(rl.InvalidMeta) as raised:
        registry.enqueue(engine, "mw.ok", {})
    assert raised.value.code == "job.invalid_meta"

    other = rl.JobRegistry()
    other.on_enqueue(lambda spec: {"too": "big" * 2000})
    with pytest.raises(rl.InvalidMeta):
        other.enqueue(engine, "mw.ok", {})
    assert scalar(engine, "SELECT count(*) FROM job_queue") == 0


async def _async_middleware(ctx, payload, call_next):  # pragma: no cover - never called
    return None


@pytest.mark.parametrize(
    ("register", "fn", "message"),
    [
        ("middleware", "not callable", "middleware takes a callable fn(ctx, payload, call_next)"),
        ("middleware", lambda ctx, payload: None, "middleware takes a callable fn(ctx, payload, call_next); its signature"),
        ("middleware", _async_middleware, "middleware takes a plain callable"),
        ("on_enqueue", lambda: None, "on_enqueue takes a callable fn(spec); its signature"),
    ],
)
def test_a_hook_the_worker_cannot_call_is_refused_when_registered(register, fn, message):
    registry = rl.JobRegistry()

    with pytest.raises(rl.RegistrationError) as raised:
        getattr(registry, register)(fn)

    assert raised.value.message.startswith(message)
    assert registry.hooks.middleware == [] and registry.hooks.enqueue_hooks == []
