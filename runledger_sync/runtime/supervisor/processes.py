"""Several worker processes under one parent: ``Supervisor(..., processes=N, app="module:attr")``.

Threads share the interpreter lock, so handlers that compute rather than wait
need processes. The parent runs no job: it starts N children with
multiprocessing's ``spawn`` (a fork would copy its threads and open database
connections), restarts one that dies, forwards shutdown and bounds the drain.

Each child is a whole worker: it imports the registry from ``app`` (a registry
object cannot be copied into another interpreter), builds its own engine from
the parent's URL, pool size and execution options, and runs its own
:class:`~runledger_sync.runtime.supervisor.supervisor.Supervisor` with worker id
``<worker_id>-p<n>`` (``-p<n>-r<k>`` after its k-th restart). Child 0 alone runs
the reaper and the scheduler: any number could (their rows are locked with
``SKIP LOCKED``), but the others would only repeat the same sweep, and child 0
is restarted like any other.

Signals: a child ignores SIGINT (a terminal's Ctrl-C reaches the whole process
group, and the parent decides) and drains on SIGTERM, however many arrive (a
service manager may signal every process as well as the parent). The parent
turns its first SIGINT/SIGTERM into one SIGTERM per child, and a second into
SIGKILL: exit now, the reaper recovers the leases. When the drain deadline
passes, the parent sends SIGUSR1: the child tells its running jobs to stop and
ends after their grace; one still running after that is killed. A child also drains when
its parent is gone (killed, say), keeping the parent's drain deadline itself: at it, it
tells its jobs to stop and ends after their grace. The URL, password included, reaches a child through
multiprocessing's pipe, never its command line or environment.

An observer (metrics) given to the group is asked for a picklable factory that
each child calls first of all, and told when a child exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from sqlalchemy.engine import Engine
from sqlalchemy.pool import QueuePool

from runledger_sync.config import JobsConfig
from runledger_sync.core.encryption import Encryption, active_encryption
from runledger_sync.core.errors import ConfigError
from runledger_sync.db.engine import create_engine
from runledger_sync.logging import configured_setup, get_logger
from runledger_sync.loading import load_registry
from runledger_sync.registry import JobRegistry
from runledger_sync.runtime.observer import ProcessesObserver, WorkerObserver

log = get_logger(__name__)

#: A child that exits with this status refused to start (its app or config): it would fail again.
EXIT_REFUSED = 2
#: Restarts of one child within a minute before the parent gives up and stops them all.
MAX_RESTARTS_PER_MINUTE = 5
#: Wait before restarting a child, by how many restarts it had in the last minute.
RESTART_BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: How often the parent looks at its children, and a child at its parent.
CHECK_SECONDS = 0.1


def check_processes(processes: Any) -> int:
    """Return ``processes`` if it is an int >= 1; raise ConfigError (``config.invalid``) otherwise."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError([f"processes must be an integer >= 1, got {processes!r}"])
    return processes


def _check_main_importable(spec: str) -> None:
    # spawn re-imports the parent's main module in each child only when it is a
    # script file or a `python -m` module other than a package's __main__; an
    # interactive session or `python -c` has nothing a child could import.
    if spec.partition(":")[0] != "__main__":
        return
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    importable = (not name.endswith("__main__")) if name else bool(getattr(main, "__file__", None))
    if not importable:
        raise ConfigError([f"app {spec!r} names the main module of an interactive session, `python -c` or "
                           "`python -m package`, which a worker process cannot import; move the registry "
                           "into a module and name that"])


@dataclass(frozen=True)
class EngineSpec:
    """What a child needs to build an engine like the parent's."""

    # With the password: it travels pickled through multiprocessing's pipe, and
    # repr=False keeps it out of any log line or traceback that shows the spec.
    url: str = field(repr=False)
    pool_size: Optional[int]
    max_overflow: Optional[int]
    execution_options: dict[str, Any]

    @classmethod
    def of(cls, engine: Engine) -> "EngineSpec":
        pool = engine.pool
        queue_pool = pool if isinstance(pool, QueuePool) else None
        spec = cls(
            url=engine.url.render_as_string(hide_password=False),
            pool_size=queue_pool.size() if queue_pool is not None else None,
            # QueuePool exposes its overflow limit only under this name.
            max_overflow=getattr(queue_pool, "_max_overflow", None) if queue_pool is not None else None,
            execution_options=dict(engine.get_execution_options()),
        )
        try:
            pickle.dumps(spec.execution_options)
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
            raise ConfigError([f"the engine's execution options cannot be sent to a worker process: {exc}"]) from exc
        return spec

    def build(self) -> Engine:
        sizes: dict[str, Any] = {
            key: value for key, value in (("pool_size", self.pool_size), ("max_overflow", self.max_overflow))
            if value is not None
        }
        # schema="" so RUNLEDGER_SCHEMA is not applied twice: the parent's
        # schema_translate_map is among the execution options already.
        engine = create_engine(self.url, schema="", **sizes)
        return engine.execution_options(**self.execution_options) if self.execution_options else engine


@dataclass(frozen=True)
class ChildSpec:
    """Everything one child is started with; pickled to it by multiprocessing."""

    app: str
    engine: EngineSpec
    config: JobsConfig
    index: int
    run_reaper: bool
    run_scheduler: bool
    parent_pid: int
    logging: Optional[dict[str, Any]]
    #: How long the child drains when it finds its parent gone (the parent, which keeps the deadline otherwise, cannot).
    drain_timeout_seconds: float
    #: Called first thing in the child for the observer its worker reports to (None: no observer).
    observer: Optional[Callable[[], WorkerObserver]] = None
    #: The parent's encryption keys (process-wide, so a spawned child would start without them).
    encryption: Optional[Encryption] = None


@dataclass
class _Slot:
    """One of the N places a child runs in, across its restarts."""

    index: int
    process: Optional[multiprocessing.process.BaseProcess] = None
    worker_id: str = ""
    restarts: int = 0
    recent_restarts: deque[float] = field(default_factory=deque)
    restart_at: Optional[float] = 0.0
    last_exit: Optional[int] = None


class ProcessGroup:
    """Start, watch, restart and stop the children of one Supervisor (``processes > 1``)."""

    def __init__(
        self, engine: Engine, registry: JobRegistry, app: Optional[str], config: JobsConfig, processes: int,
        *, run_reaper: bool, run_scheduler: bool, shutdown_event: threading.Event,
        child_main: Callable[[ChildSpec], None], observer: Optional[ProcessesObserver] = None,
    ) -> None:
        if not app:
            raise ConfigError([f"processes={processes} needs app='module:attribute' naming your JobRegistry, "
                               "so that each worker process can import it (a registry object cannot be "
                               "copied into another process)"])
        _check_main_importable(app)
        loaded = load_registry(app)
        if sorted(loaded.registered_types()) != sorted(registry.registered_types()):
            raise ConfigError([f"app {app!r} registers {sorted(loaded.registered_types())}, but the registry "
                               f"given registers {sorted(registry.registered_types())}; name the same registry"])
        self.app = app
        self.engine_spec = EngineSpec.of(engine)
        self.config = config
        self.run_reaper = run_reaper
        self.run_scheduler = run_scheduler
        self.shutdown = shutdown_event
        # The body each child runs, a Supervisor of its own: it lives in supervisor.py,
        # which imports this module, so it is handed in rather than imported.
        self.child_main = child_main
        self.slots = [_Slot(index) for index in range(processes)]
        self.observer = observer
        self._child_observer: Optional[Callable[[], WorkerObserver]] = None
        self._context = multiprocessing.get_context("spawn")
        self._monitor: Optional[threading.Thread] = None
        self._failure: Optional[str] = None
        self._drain_timeout_seconds = 0.0

    @property
    def failure(self) -> Optional[str]:
        return self._failure

    @property
    def started(self) -> bool:
        return self._monitor is not None

    @property
    def running(self) -> bool:
        return self._monitor is not None and self._monitor.is_alive()

    @property
    def exits(self) -> dict[str, Optional[int]]:
        """Each child's worker id -> the exit status of its last run (negative: killed by that signal)."""
        return {slot.worker_id: slot.last_exit for slot in self.slots if slot.last_exit is not None}

    def child_config(self, index: int, restarts: int) -> JobsConfig:
        suffix = f"-p{index}" + (f"-r{restarts}" if restarts else "")
        # replace(), not with_overrides(): the parent logs the environment's
        # adjustments once, rather than each child again.
        return replace(self.config, worker_id=f"{self.config.worker_id}{suffix}")

    def start(self, *, drain_timeout_seconds: float) -> None:
        """Start the children; each drains for ``drain_timeout_seconds`` should it outlive this process."""
        self._drain_timeout_seconds = drain_timeout_seconds
        # A worker id the suffix makes too long is refused here, not in a child
        # (checked with a restart count a long-lived group will not reach).
        self.child_config(len(self.slots) - 1, 99_999).validate()
        if self.observer is not None:
            # Asked at the start, not at construction: what it sets up (a directory,
            # say) exists only for a group that runs.
            self._child_observer = self.observer.worker_process_observer()
        self._monitor = threading.Thread(target=self._watch, name="runledger-processes", daemon=True)
        self._monitor.start()

    def stop(self, timeout: float) -> bool:
        """Ask every child to drain; wait up to ``timeout`` s; return True if all have exited."""
        self.shutdown.set()
        if self._monitor is not None:
            self._monitor.join(timeout)
        return not self.running

    def stop_jobs(self) -> None:
        """Tell every child to stop its running jobs now (the drain deadline has passed)."""
        self._signal_all(signal.SIGUSR1)

    def kill(self) -> None:
        """SIGKILL every child still running (safe from a signal handler: takes no lock)."""
        for slot in list(self.slots):
            process = slot.process
            # The monitor may reap and close it meanwhile; then there is nothing to kill.
            with contextlib.suppress(ValueError, ProcessLookupError):
                if process is not None and process.exitcode is None:
                    process.kill()

    def _watch(self) -> None:
        try:
            self._watch_until_stopped()
        except Exception as error:  # noqa: BLE001 - the thread's boundary: record it, leave no child behind
            self._failure = f"the worker process monitor failed: {error!r}"
            log.error("worker process monitor crashed; killing the worker processes", extra={"error": repr(error)},
                      exc_info=error)
            self.shutdown.set()
            self.kill()

    def _watch_until_stopped(self) -> None:
        stopping = False
        while True:
            if self.shutdown.is_set() and not stopping:
                stopping = True
                self._signal_all(signal.SIGTERM)
            for slot in self.slots:
                self._check(slot, stopping)
            live = [slot.process.sentinel for slot in self.slots if slot.process is not None]
            if stopping and not live:
                return
            multiprocessing.connection.wait(live, timeout=CHECK_SECONDS) if live else time.sleep(CHECK_SECONDS)

    def _signal_all(self, signum: int) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.pid is not None and slot.process.exitcode is None:
                try:
                    os.kill(slot.process.pid, signum)
                except ProcessLookupError:
                    pass  # exited since the check; the next look reaps it

    def _check(self, slot: _Slot, stopping: bool) -> None:
        process = slot.process
        if process is not None and process.exitcode is not None:
            slot.process, slot.last_exit, pid = None, process.exitcode, process.pid
            process.close()
            if self.observer is not None and pid is not None:
                self.observer.worker_process_exited(pid)
            if stopping:
                # A child signalled before it set its handler held no job: that ending is clean too.
                clean = slot.last_exit in (0, -signal.SIGTERM, -signal.SIGUSR1)
                (log.info if clean else log.error)("worker process stopped", extra=self._fields(slot))
                if not clean and self._failure is None:
                    self._failure = f"worker process {slot.worker_id} exited with status {slot.last_exit}"
            else:
                self._exited_unexpectedly(slot)
        if slot.process is None and slot.restart_at is not None and not stopping \
                and time.monotonic() >= slot.restart_at:
            self._spawn(slot)

    def _exited_unexpectedly(self, slot: _Slot) -> None:
        now = time.monotonic()
        while slot.recent_restarts and now - slot.recent_restarts[0] > 60:
            slot.recent_restarts.popleft()
        fields = self._fields(slot)
        if slot.last_exit == EXIT_REFUSED or len(slot.recent_restarts) >= MAX_RESTARTS_PER_MINUTE:
            why = "refused to start" if slot.last_exit == EXIT_REFUSED else \
                f"exited {MAX_RESTARTS_PER_MINUTE + 1} times within a minute"
            self._failure = f"worker process {slot.worker_id} {why} (last status {slot.last_exit})"
            log.error("worker process keeps failing; stopping the others", extra=fields | {"reason": why})
            slot.restart_at = None
            self.shutdown.set()
            return
        delay = RESTART_BACKOFF_SECONDS[min(len(slot.recent_restarts), len(RESTART_BACKOFF_SECONDS) - 1)]
        slot.recent_restarts.append(now)
        slot.restart_at = now + delay
        log.error("worker process exited unexpectedly; restarting it",
                  extra=fields | {"restart_in_seconds": delay, "restarts_in_last_minute": len(slot.recent_restarts)})

    def _fields(self, slot: _Slot) -> dict[str, Any]:
        code = slot.last_exit
        fields: dict[str, Any] = {"worker_id": slot.worker_id, "exit_code": code}
        if code is not None and code < 0:
            fields["signal"] = signal.Signals(-code).name
        return fields

    def _spawn(self, slot: _Slot) -> None:
        if slot.worker_id:
            slot.restarts += 1
        config = self.child_config(slot.index, slot.restarts)
        first = slot.index == 0
        spec = ChildSpec(
            app=self.app, engine=self.engine_spec, config=config, index=slot.index,
            run_reaper=self.run_reaper and first, run_scheduler=self.run_scheduler and first,
            parent_pid=os.getpid(), logging=configured_setup(), drain_timeout_seconds=self._drain_timeout_seconds,
            observer=self._child_observer, encryption=active_encryption(),
        )
        process = self._context.Process(target=self.child_main, args=(spec,), name=f"runledger-{config.worker_id}",
                                        # Daemonic: should the parent's interpreter exit first, it
                                        # sends each child SIGTERM (a drain) instead of waiting for ever.
                                        daemon=True)
        process.start()
        slot.process, slot.worker_id, slot.restart_at, slot.last_exit = process, config.worker_id, None, None
        log.info("worker process spawned", extra={"worker_id": config.worker_id, "pid": process.pid,
                                                  "restarts": slot.restarts})
