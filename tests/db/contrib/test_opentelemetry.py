"""OpenTelemetry: one trace from the request that enqueues to every attempt that runs the job."""

from __future__ import annotations

from typing import Iterator

import pytest

import runledger_sync as rl
from runledger_sync import testing

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from runledger_sync.contrib import opentelemetry as otel  # noqa: E402


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    yield exporter
    otel.uninstrument()


@pytest.fixture
def registry(engine) -> rl.JobRegistry:
    registry = rl.JobRegistry()

    @registry.job("otel.flaky", max_attempts=3)
    def flaky(ctx, payload):
        if ctx.attempt == 1:
            raise rl.JobFailure.retryable("otel.busy", "try again")

    @registry.job("otel.broken")
    def broken(ctx, payload):
        raise ValueError("handler bug")

    @registry.job("otel.ok")
    def ok(ctx, payload):
        return None

    registry.sync_definitions(engine)
    return registry


def spans_of(exporter, kind):
    return [span for span in exporter.get_finished_spans() if span.kind is kind]


def test_a_request_that_enqueues_and_the_workers_run_are_one_trace(engine, registry, exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("app").start_as_current_span("POST /signup", kind=SpanKind.SERVER) as request:
        job = rl.enqueue(engine, "otel.ok", {"user": 1})
    assert set(job.meta) == {"traceparent"}

    testing.drain(engine, registry)

    (producer,) = spans_of(exporter, SpanKind.PRODUCER)
    (consumer,) = spans_of(exporter, SpanKind.CONSUMER)
    trace_id = request.get_span_context().trace_id
    assert {producer.context.trace_id, consumer.context.trace_id} == {trace_id}
    assert producer.parent.span_id == request.get_span_context().span_id
    assert consumer.parent.span_id == producer.context.span_id
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    assert (producer.name, consumer.name) == ("create otel.ok", "process otel.ok")
    assert dict(producer.attributes) == {
        "messaging.system": "runledger", "messaging.operation.type": "create",
        "messaging.destination.name": "otel.ok", "messaging.message.id": str(job.id),
    }
    assert dict(consumer.attributes) == {
        "messaging.system": "runledger", "messaging.operation.type": "process",
        "messaging.destination.name": "otel.ok", "messaging.message.id": str(job.id),
        "runledger.job.run_number": 1, "runledger.job.attempt": 1, "runledger.job.outcome": "succeeded",
    }
    assert consumer.status.status_code is StatusCode.UNSET


def test_a_retrys_second_attempt_is_in_the_same_trace_and_the_failure_is_recorded(engine, registry, exporter):
    job = rl.enqueue(engine, "otel.flaky", {})

    testing.drain(engine, registry, include_scheduled=True)

    (producer,) = spans_of(exporter, SpanKind.PRODUCER)
    first, second = spans_of(exporter, SpanKind.CONSUMER)
    assert {first.context.trace_id, second.context.trace_id} == {producer.context.trace_id}
    assert [first.attributes["runledger.job.attempt"], second.attributes["runledger.job.attempt"]] == [1, 2]
    assert (first.attributes["runledger.job.outcome"], first.attributes["error.type"]) == ("failed", "otel.busy")
    assert first.status.status_code is StatusCode.ERROR
    assert [event.name for event in first.events] == ["exception"]
    assert second.attributes["runledger.job.outcome"] == "succeeded"
    assert rl.get_job(engine, job.id).status is rl.JobStatus.SUCCEEDED


def test_a_handlers_exception_is_recorded_on_its_attempts_span(engine, registry, exporter):
    rl.enqueue(engine, "otel.broken", {})

    testing.drain(engine, registry)

    (consumer,) = spans_of(exporter, SpanKind.CONSUMER)
    (event,) = consumer.events
    assert (event.name, event.attributes["exception.type"], event.attributes["exception.message"]) == (
        "exception", "ValueError", "handler bug")
    assert consumer.attributes["error.type"] == "ValueError"
    assert consumer.status.status_code is StatusCode.ERROR


def test_enqueue_many_makes_a_producer_span_per_job(engine, registry, exporter):
    jobs = rl.enqueue_many(engine, [rl.JobSpec("otel.ok", {}), rl.JobSpec("otel.ok", {}, meta={"tenant": "acme"})])

    producers = spans_of(exporter, SpanKind.PRODUCER)
    assert [span.attributes["messaging.message.id"] for span in producers] == [str(job.id) for job in jobs]
    assert jobs[1].meta["tenant"] == "acme" and "traceparent" in jobs[1].meta


def test_workflow_step_jobs_carry_the_runs_trace(engine, registry, exporter):
    workflow = rl.Workflow("otel.flow")
    first = workflow.job("first", "otel.ok", {})
    workflow.job("second", "otel.ok", {}, after=[first])

    run = rl.enqueue_workflow(engine, workflow)
    testing.drain(engine, registry)

    (producer,) = spans_of(exporter, SpanKind.PRODUCER)
    consumers = spans_of(exporter, SpanKind.CONSUMER)
    assert (producer.name, producer.attributes["messaging.message.id"]) == ("create otel.flow", str(run.id))
    assert len(consumers) == 2
    assert {span.context.trace_id for span in consumers} == {producer.context.trace_id}


def test_a_traceparent_the_caller_gave_is_kept(engine, registry, exporter):
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    job = rl.enqueue(engine, "otel.ok", {}, meta={"traceparent": given})
    testing.drain(engine, registry)

    assert job.meta == {"traceparent": given}
    assert spans_of(exporter, SpanKind.PRODUCER) == []
    (consumer,) = spans_of(exporter, SpanKind.CONSUMER)
    assert format(consumer.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


def test_a_second_instrument_changes_nothing(engine, registry, exporter):
    otel.instrument()

    rl.enqueue(engine, "otel.ok", {})
    testing.drain(engine, registry)

    assert [span.kind for span in exporter.get_finished_spans()] == [SpanKind.PRODUCER, SpanKind.CONSUMER]


def test_uninstrument_stops_tracing(engine, registry, exporter):
    otel.uninstrument()

    job = rl.enqueue(engine, "otel.ok", {})
    testing.drain(engine, registry)

    assert job.meta == {} and exporter.get_finished_spans() == ()


class Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"the trace context was {name}ed with no SDK to record it")


def test_before_an_sdk_is_set_up_no_span_is_made_and_jobs_run_as_before(engine, registry, monkeypatch):
    from opentelemetry import trace

    # The global provider is the API's placeholder until an application sets one:
    # neither enqueue nor the attempt may then spend time on spans or trace context.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    monkeypatch.setattr(otel, "_PROPAGATOR", Untouchable())
    otel.instrument()
    try:
        job = rl.enqueue(engine, "otel.ok", {})
        result = testing.drain(engine, registry)
    finally:
        otel.uninstrument()

    assert job.meta == {}
    assert result.succeeded == 1
