"""Print what OpenTelemetry instrumentation costs per attempt and per enqueued job, without a database.

Usage: python bench/otel_cost.py [--rounds 20000]

The attempt figure is one run of a no-op handler through the middleware chain
(``JobRegistry.hooks.run``, where the worker calls it) with
``runledger_sync.contrib.opentelemetry`` installed, minus the same without it:
the consumer span, its context extracted from the job's metadata, its
attributes. The enqueue figure is one enqueue observer call: the producer span
and the trace context it writes into the metadata. Spans go through the SDK's
BatchSpanProcessor to an exporter that drops them, so what is measured is
making spans, not sending them. Compare with the worker's CPU per job that
``bench/throughput.py`` prints (about 0.35-0.45 ms for a no-op job).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any, Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import runledger_sync as rl
from runledger_sync.contrib.opentelemetry import instrument, uninstrument
from runledger_sync.core import instrumentation


class Dropped(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def per_call_us(rounds: int, call: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(rounds):
            call()
        best = min(best, time.process_time() - started)
    return best / rounds * 1e6


def attempt_and_enqueue_us(rounds: int, tracer_provider: Any, registry: rl.JobRegistry, handler: Any) -> tuple[float, float]:
    """Per attempt and per enqueued job, with instrument(tracer_provider) installed (None: the global provider)."""
    job_id = uuid.uuid4()
    instrument(tracer_provider=tracer_provider)
    try:
        (observer,) = instrumentation.enqueue_observers
        meta = dict(observer("bench.noop", str(job_id), None) or {})
        ctx = rl.JobContext(job_id=job_id, run_number=1, attempt=1, organization_id=None, worker_id="bench",
                            job_type="bench.noop", meta=meta)
        traced = per_call_us(rounds, lambda: registry.hooks.run(handler, ctx, {}))
        enqueue = per_call_us(rounds, lambda: observer("bench.noop", str(job_id), None))
    finally:
        uninstrument()
    return traced, enqueue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    rounds = parser.parse_args().rounds
    registry = rl.JobRegistry()

    def handler(ctx: rl.JobContext, payload: Any) -> None:
        return None

    ctx = rl.JobContext(job_id=uuid.uuid4(), run_number=1, attempt=1, organization_id=None, worker_id="bench",
                        job_type="bench.noop", meta={})
    plain = per_call_us(rounds, lambda: registry.hooks.run(handler, ctx, {}))
    print(f"rounds={rounds} (best of 5, process CPU); attempt through the chain uninstrumented: {plain:.2f} µs")
    cases = (("every span recorded", None), ("1 in 10 traces sampled", TraceIdRatioBased(0.1)))
    for label, sampler in cases:
        provider = TracerProvider() if sampler is None else TracerProvider(sampler=ParentBased(sampler))
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        traced, enqueue = attempt_and_enqueue_us(rounds, provider, registry, handler)
        provider.shutdown()
        print(f"{label}: attempt +{traced - plain:.2f} µs, enqueue {enqueue:.2f} µs per job")
    # No SDK set up: the global provider is the API's placeholder.
    traced, enqueue = attempt_and_enqueue_us(rounds, None, registry, handler)
    print(f"no SDK set up: attempt +{traced - plain:.2f} µs, enqueue {enqueue:.2f} µs per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
