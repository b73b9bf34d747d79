"""The app ``throughput.py --job-cpu-ms`` runs: no-op jobs that first burn CPU, importable by worker processes.

``throughput.py`` names it as ``app="_cpu_app:make_registry"``; each worker
process calls the factory, which reads the CPU time per job from
:data:`CPU_MS_VARIABLE` (set by the script before the processes start).
"""

from __future__ import annotations

import os
import time

import _common as bench

import runledger_sync as rl

CPU_MS_VARIABLE = "RUNLEDGER_BENCH_JOB_CPU_MS"
#: Loop turns between two reads of the thread's CPU clock.
BYTECODE_STRETCH = 256


def make_registry() -> rl.JobRegistry:
    cpu_seconds = float(os.environ.get(CPU_MS_VARIABLE, "0")) / 1000

    def burn(_payload: dict) -> None:
        # The thread's own CPU clock, not the wall clock: a thread waiting for the
        # interpreter lock must not count that wait as work done. Reading that clock
        # is a system call, so it is read between stretches of bytecode (about
        # 20 us each) for the work to be the interpreter's, as a handler's would be.
        end = time.thread_time() + cpu_seconds
        n = 0
        while time.thread_time() < end:
            for i in range(BYTECODE_STRETCH):
                n = (n * 31 + i) % 1_000_003

    return bench.noop_registry(burn)
