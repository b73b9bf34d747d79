"""Typed payloads beyond ``@registry.job``: a class handler's ``payload_model``, and ``registry.enqueue_workflow``."""

from __future__ import annotations

import contextlib

import pydantic
import pytest

import runledger_sync as rl
from runledger_sync import testing
from tests.support import rows, scalar

SECRET = "hunter2-secret-value"


class Order(pydantic.BaseModel):
    order_id: int
    qty: int = pydantic.Field(gt=0)


class SyncOrder(rl.JobHandler):
    job_type = "orders.sync"
    payload_model = Order

    def __init__(self, received: list) -> None:
        self.received = received

    def execute(self, ctx, order):
        self.received.append((order, dict(ctx.meta)))


@pytest.fixture
def received() -> list:
    return []


@pytest.fixture
def registry(engine, received) -> rl.JobRegistry:
    registry = rl.JobRegistry()
    registry.register(SyncOrder(received))

    @registry.job("orders.notify")
    def notify(ctx, payload):
        received.append((payload, dict(ctx.meta)))

    registry.sync_definitions(engine)
    return registry


def written(engine) -> tuple[int, int]:
    return (scalar(engine, "SELECT count(*) FROM job_queue"), scalar(engine, "SELECT count(*) FROM workflow_runs"))


def test_a_class_handler_with_a_payload_model_receives_the_model_instance(engine, registry, received):
    job = registry.enqueue(engine, "orders.sync", {"order_id": "3", "qty": 4})
    assert job.payload == {"order_id": 3, "qty": 4}

    assert testing.drain(engine, registry).by_outcome == {"succeeded": 1}
    [(order, _)] = received
    assert isinstance(order, Order) and (order.order_id, order.qty) == (3, 4)


def test_registry_enqueue_checks_a_class_handlers_model_and_writes_nothing(engine, registry):
    with pytest.raises(rl.InvalidPayload) as raised:
        registry.enqueue(engine, "orders.sync", {"order_id": SECRET, "qty": 1})
    assert raised.value.code == "job.invalid_payload"
    assert raised.value.details["errors"] == [
        "order_id: Input should be a valid integer, unable to parse string as an integer"]
    assert SECRET not in str(raised.value)
    assert written(engine) == (0, 0)


def test_a_stored_payload_a_class_handlers_model_refuses_dead_letters_without_running_it(engine, registry, received):
    job = rl.enqueue(engine, "orders.sync", {"order_id": 1, "qty": 0})
    testing.drain(engine, registry)
    assert rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED
    [row] = rows(engine, "SELECT status_reason, last_error_code FROM job_queue")
    assert (row.status_reason, row.last_error_code) == ("TERMINAL", "job.invalid_payload")
    assert received == []


def test_a_class_handler_with_a_bad_payload_model_is_refused_at_registration():
    class Bad(rl.JobHandler):
        job_type = "bad.model"
        payload_model = dict

        def execute(self, ctx, payload):  # pragma: no cover - never registered
            pass

    registry = rl.JobRegistry()
    with pytest.raises(rl.RegistrationError) as raised:
        registry.register(Bad())
    assert raised.value.code == "registry.invalid_payload_model"
    assert "bad.model" not in registry


def test_a_wrapped_registry_keeps_a_class_handlers_model(engine, registry, received):
    wrapped = registry.wrapped(contextlib.nullcontext)
    wrapped.enqueue(engine, "orders.sync", {"order_id": 5, "qty": 1})
    with pytest.raises(rl.InvalidPayload):
        wrapped.enqueue(engine, "orders.sync", {"order_id": 5, "qty": 0})
    testing.drain(engine, wrapped)
    assert isinstance(received[0][0], Order)


# -- registry.enqueue_workflow ---------------------------------------------------------


def order_workflow(first: dict, **options) -> rl.Workflow:
    wf = rl.Workflow("order.fulfil", **options)
    sync = wf.job("sync", "orders.sync", first)
    wf.job("notify", "orders.notify", {"to": "ops"}, after=[sync], release="on_success")
    return wf


def test_enqueue_workflow_refuses_a_bad_step_payload_naming_the_step_and_writes_nothing(engine, registry):
    with pytest.raises(rl.InvalidPayload) as raised:
        registry.enqueue_workflow(engine, order_workflow({"order_id": 1, "qty": SECRET}))
    error = raised.value
    assert error.code == "job.invalid_payload"
    assert error.message == ("the payload of step 'sync' must be valid for Order, got 1 error: "
                             "qty: Input should be a valid integer, unable to parse string as an integer")
    assert SECRET not in str(error) and SECRET not in repr(error.details)
    assert error.__context__ is None
    assert written(engine) == (0, 0)


def test_enqueue_workflow_stores_typed_payloads_applies_hooks_to_the_run_and_runs(engine, registry, received):
    seen = []

    @registry.on_enqueue
    def tenant(spec):
        seen.append((spec.job_type, spec.payload, dict(spec.meta or {})))
        return {"tenant": "from-hook", "step": spec.job_type}

    wf = order_workflow({"order_id": "7", "qty": 2}, meta={"tenant": "acme"})
    run = registry.enqueue_workflow(engine, wf)

    # The caller's key wins; the first step's hook call sets "step", which the later one cannot change.
    assert run.meta == {"tenant": "acme", "step": "orders.sync"}
    assert seen == [("orders.sync", {"order_id": 7, "qty": 2}, {"tenant": "acme"}),
                    ("orders.notify", {"to": "ops"}, {"tenant": "acme", "step": "orders.sync"})]
    # The workflow given is left as built.
    assert wf.meta == {"tenant": "acme"} and wf.steps[0].payload == {"order_id": "7", "qty": 2}

    assert testing.drain(engine, registry).by_outcome == {"succeeded": 2}
    assert rl.get_workflow_run(engine, run.id).status is rl.WorkflowRunStatus.SUCCEEDED
    [(order, sync_meta), (notify_payload, notify_meta)] = received
    assert isinstance(order, Order) and order.order_id == 7
    assert notify_payload == {"to": "ops"}
    assert sync_meta == notify_meta == {"tenant": "acme", "step": "orders.sync"}


def test_enqueue_workflow_joins_the_callers_transaction_and_passes_options(engine, registry):
    wf = order_workflow({"order_id": 1, "qty": 1})
    with engine.begin() as connection:
        run = registry.enqueue_workflow(connection, wf, max_payload_bytes=1024)
    assert rl.get_workflow_run(engine, run.id) is not None
    with pytest.raises(rl.InvalidArgument):
        registry.enqueue_workflow(engine, "not a workflow")
