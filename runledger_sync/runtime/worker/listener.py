"""The worker's LISTEN connection: wake an idle polling thread when its job types are enqueued.

The same connection hears operators' cancels (``on_canceled``): each read of
it hands the ids of canceled jobs on, whether the worker is idle or busy (a
busy worker reads it between waits for a free slot, and once per claim while
backed up), so a running handler is told at once
(:mod:`runledger_sync.runtime.attempt.cancels`).

The scheduler loop keeps one of its own on the schedules channel, woken when a
schedule is written or resumed. Each runs on the polling thread itself
(``WorkerLoop.pause`` calls :meth:`JobListener.wait`), so it adds no thread. When the
connection is lost the worker falls back to plain
polling and the listener reconnects on a later pause, at most once per
:data:`RECONNECT_SECONDS`. Each change of state is logged once.

A LISTEN can also fail without any error: behind a transaction-pooling proxy
the session that registered it is not the listener's for long, so nothing
arrives. The listener therefore proves delivery with a probe (see
:mod:`runledger_sync.store.notify`): after connecting, before it listens for
jobs, and on each idle pause. A probe not echoed within
:data:`PROBE_TIMEOUT_SECONDS` counts as a lost connection; repeated failures
back off up to :data:`MAX_RECONNECT_SECONDS`. An engine whose pool mode is
``transaction`` (or whose sessions were found shared) never listens.
"""

from __future__ import annotations

import secrets
import select
import time
from typing import Any, Callable, Iterable, Optional

import psycopg2.extensions

from runledger_sync.logging import get_logger
from runledger_sync.store.driver import CANCELED_CHANNEL, CHANNEL, Driver, new_probe_channel

log = get_logger(__name__)

#: How long a lost listener waits before trying to LISTEN again (doubled after each failed probe).
RECONNECT_SECONDS = 1.0
#: The longest wait between attempts while probes keep failing.
MAX_RECONNECT_SECONDS = 60.0
#: How long a probe notification may take to come back before the listener counts as lost.
#: Directly it takes about a millisecond; this only bounds a LISTEN that delivers nothing.
PROBE_TIMEOUT_SECONDS = 1.0


class ProbeNotEchoed(Exception):
    """A probe notification did not come back to the listener in time: its LISTEN delivers nothing."""


class JobListener:
    """One LISTEN connection and its connected/lost state.

    Args:
        driver: one that owns its transactions; the LISTEN connection is opened on its engine.
        job_types: the payloads that wake :meth:`wait`; None: any notification on ``channel``.
        probe_bind: where probes are sent from (the polling thread's own connection);
            defaults to ``driver``.
        probe_interval_seconds: the least time between two probes of a connected listener.
        channel: :data:`~runledger_sync.store.driver.CHANNEL` (enqueued job types) or
            :data:`~runledger_sync.store.driver.SCHEDULES_CHANNEL`.
        name: how its log lines call it (``listener connected``, ``listener lost; polling``).
        on_canceled: called, on the thread reading the listener, with the ids of
            jobs operators canceled; None: it does not listen for cancels.
    """

    def __init__(
        self, driver: Driver, job_types: Optional[Iterable[str]], *, worker_id: str,
        probe_bind: Optional[Driver] = None, probe_interval_seconds: float = 1.0,
        channel: str = CHANNEL, name: str = "listener",
        on_canceled: Optional[Callable[[set[str]], None]] = None,
    ) -> None:
        self.name = name
        self.on_canceled = on_canceled
        self.driver = driver
        self.job_types = None if job_types is None else frozenset(job_types)
        self.channel = channel
        self.worker_id = worker_id
        self.probe_bind = probe_bind if probe_bind is not None else driver
        self.probe_channel = new_probe_channel()
        self.probe_interval_seconds = probe_interval_seconds
        self._probed_at = 0.0
        self._connection: Optional[psycopg2.extensions.connection] = None
        self._retry_at = 0.0
        self._failures = 0
        # The probe sent and not yet echoed: (payload, monotonic time sent).
        self._probe: Optional[tuple[str, float]] = None
        # A relevant notification that probe() read: kept for the next wait(), not dropped.
        self._notified = False
        # None until the first attempt, so the first outcome is logged either way.
        self._was_connected: Optional[bool] = None
        self._off_logged = False

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def connect_if_due(self) -> bool:
        """LISTEN if not listening and the backoff has passed; return True only on a new connection.

        A new connection has missed whatever was enqueued before it, so the caller
        should claim once more before waiting.
        """
        if self._connection is not None or time.monotonic() < self._retry_at or not self._allowed():
            return False
        try:
            # The probe channel first: a LISTEN that cannot deliver then leaves behind at
            # most that channel, on which only this listener's own probes are ever sent.
            connection = self._connection = self.driver.open_listener((self.probe_channel,))
            self._send_probe()
            self._await_echo(connection, PROBE_TIMEOUT_SECONDS)
            if self.on_canceled is not None:
                self.driver.listen(connection, CANCELED_CHANNEL)
            self.driver.listen(connection, self.channel)
        except Exception as error:  # noqa: BLE001 - any failure means: poll, try again later
            self._lost(error)
            return False
        self._failures = 0
        if self._was_connected is not True:
            log.info(f"{self.name} connected", extra={"worker_id": self.worker_id, "channel": self.channel})
        self._was_connected = True
        return True

    def probe(self) -> None:
        """On an idle pause: check that the last probe came back, and send the next one when due.

        A probe still missing after :data:`PROBE_TIMEOUT_SECONDS` marks the listener
        lost. A probe that cannot be sent (the database is unreachable) is tried on
        a later pause: the claim reports that outage.
        """
        if self._connection is None:
            return
        if not self._allowed():
            self.close()
            return
        try:
            self._notified = self._relevant(self._read(self._connection)) or self._notified
            if self._probe is not None:
                if time.monotonic() - self._probe[1] > PROBE_TIMEOUT_SECONDS:
                    raise ProbeNotEchoed(f"no echo of a probe notification within {PROBE_TIMEOUT_SECONDS:g} s")
                return
        except (OSError, ValueError, psycopg2.Error, ProbeNotEchoed) as error:
            self._lost(error)
            return
        if time.monotonic() - self._probed_at < self.probe_interval_seconds:
            return
        try:
            self._send_probe()
        except Exception as error:  # noqa: BLE001 - the next pause tries again
            log.debug(f"{self.name} probe not sent", extra={"worker_id": self.worker_id, "error": str(error)})

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; return True when one of our job types was notified.

        Returns False at once when not connected (the caller polls instead), and
        on a lost connection, after marking it lost.
        """
        connection = self._connection
        if connection is None:
            return False
        try:
            # Notifications already read into psycopg2's buffer do not make the socket readable.
            notified, self._notified = self._notified, False
            if notified or self._relevant(self._read(connection)):
                return True
            readable, _, _ = select.select([connection], [], [], timeout)
            return bool(readable) and self._relevant(self._read(connection))
        except (OSError, ValueError, psycopg2.Error) as error:
            # ValueError: select() on a connection whose socket is already closed.
            self._lost(error)
            return False

    def read_while_busy(self) -> None:
        """Read what has arrived: hand cancels on, drop wake-ups (a busy worker has no slot for new jobs).

        Reading also keeps a busy worker's listener from backing up the server's queue.
        """
        self._notified = False
        if self._connection is None:
            return
        try:
            self._read(self._connection)
        except (OSError, ValueError, psycopg2.Error) as error:
            self._lost(error)

    def close(self) -> None:
        """UNLISTEN and close the connection (the listener connects again on a later pause, if allowed)."""
        connection, self._connection = self._connection, None
        self._probe = None
        self._notified = False
        if connection is not None:
            self.driver.close_listener(connection)

    def _allowed(self) -> bool:
        if self.driver.listens:
            return True
        if not self._off_logged:
            self._off_logged = True
            log.info(f"{self.name} off; polling", extra={
                "worker_id": self.worker_id, "pool_mode": self.driver.pool_mode,
                "reason": "the engine's sessions are shared between clients (transaction pooling)",
            })
        return False

    def _send_probe(self) -> None:
        payload = secrets.token_hex(8)
        self.probe_bind.send_probe(self.probe_channel, payload)
        self._probe = (payload, time.monotonic())
        self._probed_at = self._probe[1]

    def _await_echo(self, connection: psycopg2.extensions.connection, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._probe is not None:
            self._read(connection)
            remaining = deadline - time.monotonic()
            if self._probe is None:
                return
            if remaining <= 0:
                raise ProbeNotEchoed(f"no echo of a probe notification within {timeout:g} s "
                                     "(a transaction-pooling proxy between the worker and PostgreSQL?)")
            select.select([connection], [], [], remaining)

    def _read(self, connection: psycopg2.extensions.connection) -> set[str]:
        """Read what has arrived: note a probe's echo, hand cancels on, return the job types notified."""
        payloads = self.driver.read_notifications(connection)
        if self._probe is not None and self._probe[0] in payloads.get(self.probe_channel, ()):
            self._probe = None
        canceled = payloads.get(CANCELED_CHANNEL)
        if canceled and self.on_canceled is not None:
            self.on_canceled(canceled)
        return payloads.get(self.channel, set())

    def _relevant(self, types: set[str]) -> bool:
        return bool(types) if self.job_types is None else not self.job_types.isdisjoint(types)

    def _lost(self, error: Any) -> None:
        self.close()
        # A listener that keeps failing its probes backs off: each attempt may leave a
        # LISTEN on a pooled session that is not ours.
        self._failures = self._failures + 1 if isinstance(error, ProbeNotEchoed) else 0
        delay = min(MAX_RECONNECT_SECONDS, RECONNECT_SECONDS * 2 ** max(0, self._failures - 1))
        self._retry_at = time.monotonic() + delay
        if self._was_connected is not False:
            log.warning(f"{self.name} lost; polling", extra={
                "worker_id": self.worker_id, "channel": self.channel, "error": str(error), "retry_in_seconds": delay,
            })
        self._was_connected = False
