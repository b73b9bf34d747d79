"""Run the fault scenarios of issue 6 at full size and print what each one lost or duplicated.

Usage: python bench/chaos.py [--scale full|ci|0.5] [--only churn,restart,terminate,cut,concurrency,suicide,hang,soak]

The scenarios are the ones ``tests/faults`` runs at CI sizes (``tests/faults/scenarios.py``),
on real worker processes and an embedded PostgreSQL started in a temporary directory.
Exit status 1 if any scenario broke one of its expectations (listed under the table).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

# The scenarios live beside the tests, so the report and CI can never drift apart.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runledger_sync as rl  # noqa: E402
from tests.faults import scenarios  # noqa: E402

COLUMNS = ("scenario", "jobs", "lost", "duplicate effects", "duplicate completions", "recovery s", "seconds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="full", help="full (default), ci, or a fraction of the full sizes")
    parser.add_argument("--only", default="", help="comma-separated scenario keys (default: all)")
    args = parser.parse_args()
    sizes = scenarios.sizes_from_env({scenarios.SCALE_VARIABLE: args.scale})
    root = Path(tempfile.mkdtemp(prefix="rl-chaos-"))
    server = rl.EmbeddedPostgres(root / "pgdata", delete_on_stop=True).start()
    template = "chaos_template"
    engine = rl.create_engine(server.create_database(template, drop_existing=True))
    rl.migrate(engine)
    engine.dispose()
    counter = iter(range(1, 1_000))

    def database() -> str:
        return server.create_database(f"chaos_{next(counter)}", template=template)

    runs: dict[str, Callable[[], scenarios.ScenarioResult]] = {
        "churn": lambda: scenarios.worker_sigkill_churn(database(), sizes),
        "restart": lambda: scenarios.postgres_restart(root / "restart", sizes),
        "terminate": lambda: scenarios.terminate_backends(database(), sizes),
        "restart-app-writes": lambda: scenarios.restart_under_app_writes(root / "restart-app", sizes),
        "cut": lambda: scenarios.network_cut(database()).result,
        "concurrency": lambda: scenarios.concurrency(database(), sizes),
        "suicide": lambda: scenarios.poison_suicide(database()),
        "hang": lambda: scenarios.poison_hang(database(), sizes),
        "soak": lambda: scenarios.memory_soak(database(), sizes),
    }
    chosen = [key.strip() for key in args.only.split(",") if key.strip()] or list(runs)
    unknown = set(chosen) - set(runs)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    print(f"sizes: {sizes}", flush=True)
    results = []
    try:
        for key in chosen:
            started = time.monotonic()
            (root / "restart").mkdir(exist_ok=True)
            result = runs[key]()
            results.append((result, time.monotonic() - started))
            print(f"  {key}: done in {results[-1][1]:.0f} s; {result.details}", flush=True)
    finally:
        server.stop()
    print_table(results)
    failed = [(result, problem) for result, _ in results for problem in result.problems]
    for result, problem in failed:
        print(f"FAILED {result.scenario}: {problem}")
    return 1 if failed else 0


def cell(value: object) -> str:
    return "-" if value is None else str(value)


def print_table(results: list[tuple[scenarios.ScenarioResult, float]]) -> None:
    rows = [COLUMNS] + [
        (r.scenario, cell(r.jobs), cell(r.lost), cell(r.duplicate_effects), cell(r.duplicate_completions),
         cell(r.recovery_seconds), f"{seconds:.0f}")
        for r, seconds in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    print()
    for n, row in enumerate(rows):
        print("| " + " | ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    sys.exit(main())
