"""OpenTelemetry traces from enqueue to handler (the extra ``otel``: ``opentelemetry-api``).

Call :func:`instrument` once at startup, in the processes that enqueue and in
the workers. Then every job enqueued (``rl.enqueue``, ``rl.enqueue_many``, a
registry's, a schedule's) gets a PRODUCER span ``create <job type>``, a child of
whatever span is current, and that span's W3C trace context is stored in the
job's metadata (keys ``traceparent`` and, when set, ``tracestate``). A
workflow run gets one for the run, and the jobs of its steps carry the run's
trace. Every attempt a worker runs is a CONSUMER span ``process <job type>``
whose parent is that context, so enqueue and run are one trace, and which links
to it, as the messaging conventions ask of a process span. A retry's attempt is
another span of the same trace.

Attributes follow the messaging semantic conventions: ``messaging.system``
(``runledger``), ``messaging.operation.type`` (``create`` or ``process``),
``messaging.destination.name`` (the job type, or
the workflow's name) and ``messaging.message.id`` (the job id, or the run id),
plus ``runledger.job.run_number``, ``runledger.job.attempt`` and
``runledger.job.outcome`` (``succeeded``, ``continued`` or ``failed``; the
failure's code or exception type is ``error.type``). What a handler raises is
recorded on its attempt's span as an exception event, with status ERROR.

A job whose metadata already holds a ``traceparent`` keeps it. Spans go through
the tracer provider given, or the global one; without an SDK configured they
are no-ops. Nothing here is imported unless you import it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from runledger_sync.core import instrumentation
from runledger_sync.core.errors import MissingExtra
from runledger_sync.core.types import JobCompletion, JobContext, JobFailure, Snooze

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised by the extras test in a subprocess
    raise MissingExtra("otel", "opentelemetry-api") from None

#: ``messaging.system``: this queue.
MESSAGING_SYSTEM = "runledger"
_PROPAGATOR = TraceContextTextMapPropagator()
_uninstall: Optional[Callable[[], None]] = None


def instrument(tracer_provider: Any = None) -> None:
    """Trace every enqueue and every attempt of this process (a second call changes nothing).

    Args:
        tracer_provider: an OpenTelemetry ``TracerProvider``; None: the global one.

    Example:
        ``from runledger_sync.contrib.opentelemetry import instrument; instrument()``
    """
    global _uninstall
    if _uninstall is not None:
        return
    tracer = trace.get_tracer("runledger_sync", tracer_provider=tracer_provider)
    can_record = _can_record(tracer_provider)
    _uninstall = instrumentation.install(on_enqueue=_producer(tracer, can_record),
                                         middleware=_consumer(tracer, can_record))


def uninstrument() -> None:
    """Stop tracing what :func:`instrument` traced."""
    global _uninstall
    if _uninstall is not None:
        _uninstall()
        _uninstall = None


def _can_record(tracer_provider: Any) -> Callable[[], bool]:
    """Whether spans can be recorded at all: not before an SDK's provider is set (the API's placeholder).

    Asked on every enqueue and attempt, so that a process instrumented before its
    SDK is set up (or without one) pays a type check, not a span's making.
    """
    placeholders = (ProxyTracerProvider, NoOpTracerProvider)
    if tracer_provider is not None:
        recording = not isinstance(tracer_provider, placeholders)
        return lambda: recording
    return lambda: not isinstance(trace.get_tracer_provider(), placeholders)


def _producer(tracer: Any, can_record: Callable[[], bool]) -> instrumentation.EnqueueObserver:
    def on_enqueue(name: str, id_text: str, meta: Optional[Mapping[str, str]]) -> Optional[Mapping[str, str]]:
        if (meta and "traceparent" in meta) or not can_record():
            return None
        attributes = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "create",
            "messaging.destination.name": name,
            "messaging.message.id": id_text,
        }
        # The span ends once the job is made: a "create" span covers the message's creation.
        with tracer.start_as_current_span(f"create {name}", kind=SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
        return carrier

    return on_enqueue


def _consumer(tracer: Any, can_record: Callable[[], bool]) -> instrumentation.ProcessMiddleware:
    def around_attempt(ctx: JobContext, payload: Any, call_next: Callable[[Any, Any], Any]) -> Any:
        if not can_record():
            return call_next(ctx, payload)
        parent = _PROPAGATOR.extract(ctx.meta)
        created = trace.get_current_span(parent).get_span_context()
        attributes = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.job_type,
            "messaging.message.id": str(ctx.job_id),
            "runledger.job.run_number": ctx.run_number,
            "runledger.job.attempt": ctx.attempt,
        }
        links = [Link(created)] if created.is_valid else []
        with tracer.start_as_current_span(
            f"process {ctx.job_type}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                result = call_next(ctx, payload)
            except Snooze:
                span.set_attribute("runledger.job.outcome", "continued")
                raise
            except BaseException as exc:  # noqa: BLE001 - recorded and raised again, whatever it is
                span.record_exception(exc)
                error_type = exc.code if isinstance(exc, JobFailure) else type(exc).__qualname__
                span.set_attributes({"runledger.job.outcome": "failed", "error.type": error_type})
                span.set_status(Status(StatusCode.ERROR, error_type))
                raise
            continued = isinstance(result, JobCompletion) and result.continue_after is not None
            span.set_attribute("runledger.job.outcome", "continued" if continued else "succeeded")
            return result

    return around_attempt
