"""Typed payloads: ``payload_model`` checks a payload before anything is written, and the handler gets the model."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest

import runledger_sync as rl
from tests.handlers import fast_config
from tests.support import rows, run_worker_until, scalar

SECRET = "hunter2-secret-value"


class Line(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(gt=0)


class Order(pydantic.BaseModel):
    order_id: int
    lines: list[Line]
    note: str = ""


def registry_with(received: list) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job("orders.sync", payload_model=Order)
    def sync_order(ctx, order):
        received.append(order)

    return registry


@pytest.fixture
def received() -> list:
    return []


@pytest.fixture
def registry(engine, received) -> rl.JobRegistry:
    registry = registry_with(received)
    registry.sync_definitions(engine)
    return registry


def job_count(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM job_queue")


def test_an_invalid_payload_is_refused_with_each_field_path_and_writes_nothing(engine, registry):
    with pytest.raises(rl.InvalidPayload) as raised:
        registry.enqueue(engine, "orders.sync", {"order_id": SECRET, "lines": [{"sku": SECRET, "qty": -5}]})
    error = raised.value
    assert error.code == "job.invalid_payload"
    assert error.message == (
        "payload must be valid for Order, got 2 errors: order_id: Input should be a valid integer, unable to parse "
        "string as an integer; lines.0.qty: Input should be greater than 0")
    assert error.details["errors"] == ["order_id: Input should be a valid integer, unable to parse string as an integer",
                                       "lines.0.qty: Input should be greater than 0"]
    # No value is repeated, in the error or in what it was raised from.
    assert SECRET not in str(error) and "-5" not in str(error) and SECRET not in repr(error.details)
    assert error.__context__ is None and error.__cause__ is None
    assert job_count(engine) == 0


def test_a_valid_payload_is_stored_as_the_models_dump(engine, registry):
    job = registry.enqueue(engine, "orders.sync", {"order_id": "7", "lines": [{"sku": "a", "qty": 2}]}, priority=5)
    assert job.payload == {"order_id": 7, "lines": [{"sku": "a", "qty": 2}], "note": ""}
    assert job.priority == 5


def test_a_model_instance_is_accepted_by_both_enqueues(engine, registry):
    order = Order(order_id=1, lines=[Line(sku="a", qty=1)])
    assert registry.enqueue(engine, "orders.sync", order).payload == order.model_dump(mode="json")
    assert rl.enqueue(engine, "orders.sync", order).payload == order.model_dump(mode="json")
    [spec_job] = rl.enqueue_many(engine, [rl.JobSpec("orders.sync", order)])
    assert spec_job.payload["order_id"] == 1


def test_an_instance_its_class_refuses_is_refused_by_rl_enqueue_too(engine, registry):
    broken = Order.model_construct(order_id=SECRET, lines=[])
    with pytest.raises(rl.InvalidPayload) as raised:
        rl.enqueue(engine, "orders.sync", broken)
    assert raised.value.message.startswith("payload must be valid for Order, got 1 error: order_id: ")
    assert SECRET not in str(raised.value)
    assert job_count(engine) == 0


def test_the_handler_receives_a_model_instance(engine, registry, received):
    job = registry.enqueue(engine, "orders.sync", {"order_id": 3, "lines": [{"sku": "b", "qty": 4}]})
    run_worker_until(engine, registry, fast_config(),
                     lambda: rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED)
    [order] = received
    assert isinstance(order, Order)
    assert (order.order_id, order.lines[0].qty) == (3, 4)


def test_a_stored_payload_the_model_refuses_dead_letters_without_running_the_handler(engine, registry, received):
    # rl.enqueue does not know the registry, so a plain dict reaches the worker unchecked.
    job = rl.enqueue(engine, "orders.sync", {"order_id": 1, "lines": [{"sku": SECRET}]})
    run_worker_until(engine, registry, fast_config(),
                     lambda: rl.get_job(engine, job.id).status is rl.JobStatus.DEAD_LETTERED)
    [row] = rows(engine, "SELECT status_reason, last_error_code, last_error_message FROM job_queue")
    assert (row.status_reason, row.last_error_code) == ("TERMINAL", "job.invalid_payload")
    assert row.last_error_message == "payload must be valid for Order, got 1 error: lines.0.qty: Field required"
    assert received == []


def test_without_pydantic_nothing_is_imported_and_plain_payloads_work(fresh_database):
    script = (
        "import sys; sys.modules['pydantic'] = None\n"
        "import runledger_sync as rl\n"
        "registry = rl.JobRegistry()\n"
        "@registry.job('plain.job')\n"
        "def plain(ctx, payload): pass\n"
        f"engine = rl.create_engine({fresh_database!r})\n"
        "registry.sync_definitions(engine)\n"
        "print(registry.enqueue(engine, 'plain.job', {'a': 1}).payload, rl.enqueue(engine, 'plain.job').payload)\n"
        "try:\n"
        "    registry.job('typed.job', payload_model=dict)(plain)\n"
        "except rl.RegistrationError as error:\n"
        "    print(error.code)\n"
        "assert sys.modules['pydantic'] is None\n"
        "engine.dispose()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["{'a': 1} {}", "registry.invalid_payload_model"]


def test_importing_the_library_does_not_import_pydantic():
    script = "import sys, runledger_sync, runledger_sync.cli; print('pydantic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr
