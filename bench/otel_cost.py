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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    rounds = parser.parse_args().rounds
    registry = rl.JobRegistry()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))

    def handler(ctx: rl.JobContext, payload: Any) -> None:
        return None

    job_id = uuid.uuid4()
    instrument(tracer_provider=provider)
    (observer,) = instrumentation.enqueue_observers
    meta = dict(observer("bench.noop", str(job_id), None) or {})
    ctx = rl.JobContext(job_id=job_id, run_number=1, attempt=1, organization_id=None, worker_id="bench",
                        job_type="bench.noop", meta=meta)
    traced = per_call_us(rounds, lambda: registry.hooks.run(handler, ctx, {}))
    enqueue = per_call_us(rounds, lambda: observer("bench.noop", str(job_id), None))
    uninstrument()
    plain = per_call_us(rounds, lambda: registry.hooks.run(handler, ctx, {}))
    provider.shutdown()
    print(f"rounds={rounds} (best of 5, process CPU)")
    print(f"attempt through the chain: {plain:.2f} µs plain, {traced:.2f} µs traced (+{traced - plain:.2f} µs)")
    print(f"enqueue observer (producer span + context into meta): {enqueue:.2f} µs per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
