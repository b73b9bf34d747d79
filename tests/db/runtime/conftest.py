"""Fixtures for the runtime tests: short-interval configs, loops in background threads, probes.

Every loop started through :func:`start_loop` and every probe made through
:func:`probe` is stopped or released at teardown, before the test database is
dropped, so a failing test cannot leave threads writing into the next one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator, Optional

import pytest

from runledger_sync.config import JobsConfig
from runledger_sync.core.types import RuntimeLoopExit
from runledger_sync.runtime.loops.reaper import run_reaper_loop
from runledger_sync.store.driver import driver_for
from runledger_sync.runtime.worker.loop import run_worker_loop
from tests.handlers import SECRET, Probe, fast_config

class RunningLoop:
    """A runtime loop in a daemon thread, with its own shutdown event."""

    def __init__(self, loop: Callable[..., RuntimeLoopExit], engine: Any, registry: Any, config: JobsConfig,
                 **options: Any) -> None:
        self.shutdown = threading.Event()
        self.exits: list[Any] = []
        self.thread = threading.Thread(
            target=lambda: self.exits.append(loop(engine, registry, config, self.shutdown, **options)),
            name=f"test-{loop.__name__}", daemon=True,
        )
        self.thread.start()

    def stop(self, timeout: float = 15.0) -> Optional[RuntimeLoopExit]:
        """Ask the loop to stop and wait for it; return its exit (None if it did not stop)."""
        self.shutdown.set()
        self.thread.join(timeout)
        return self.exits[0] if self.exits else None


@pytest.fixture
def probe() -> Iterator[Probe]:
    made = Probe()
    yield made
    made.release.set()


@pytest.fixture
def start_loop(engine) -> Iterator[Callable[..., RunningLoop]]:
    started: list[RunningLoop] = []

    def start(kind: str, registry: Any, config: Optional[JobsConfig] = None, *, bind: Any = None,
              **options: Any) -> RunningLoop:
        """Start a ``worker`` or ``reaper`` loop; ``options`` go to it (a worker's ``observer=``, say)."""
        bind = bind if bind is not None else engine
        # The worker through its public entry, on the bind; the reaper on a driver, as the supervisor runs it.
        loop, target = {"worker": (run_worker_loop, bind), "reaper": (run_reaper_loop, driver_for(bind))}[kind]
        running = RunningLoop(loop, target, registry, config or fast_config(), **options)
        started.append(running)
        return running

    yield start
    for running in started:
        running.shutdown.set()
    for running in started:
        running.thread.join(15)


@pytest.fixture
def logs(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """Capture runledger_sync records at INFO and check, after the test, that no payload leaked."""
    caplog.set_level(logging.INFO, logger="runledger_sync")
    yield caplog
    for record in caplog.get_records("setup") + caplog.get_records("call"):
        texts = [record.getMessage()] + [repr(value) for value in vars(record).values()]
        assert not any(SECRET in text for text in texts), f"payload contents logged in {record.getMessage()!r}"
