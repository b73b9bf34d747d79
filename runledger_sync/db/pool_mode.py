"""The connection policy of an engine: what the store may leave on a database session.

PostgreSQL keeps prepared statements, LISTEN registrations and session settings
with the session (the server connection). Directly, or behind PgBouncer in
session pooling mode, a client connection keeps one session for its life, so
the store prepares its hottest statements there and an idle worker LISTENs. In
PgBouncer's transaction pooling mode each transaction may run on another
server connection, shared with other clients: a statement prepared by one
client is found (``already exists``) or missed (``does not exist``) by the
next, and a LISTEN stays behind on a server connection whose notifications
reach whichever client runs there next.

So each engine built here carries one :class:`ConnectionPolicy` as the
execution option :data:`POLICY_OPTION`:

- ``session`` (the default): prepared statements and LISTEN, as before;
- ``transaction``: no SQL-level PREPARE, no LISTEN (idle workers poll), no
  session ``SET``; every statement is one transaction using ``SET LOCAL`` only.

A session policy that meets the signs of shared sessions (see
:mod:`runledger_sync.store.prepared`) stops preparing and listening for the
rest of the engine's life: :meth:`ConnectionPolicy.mark_sessions_shared`.
"""

from __future__ import annotations

import enum
import os
import threading
import weakref
from typing import Any, Mapping, Optional

from runledger_sync.core.errors import ConfigError

#: The environment variable naming the pool mode of engines built by ``rl.create_engine``.
POOL_MODE_VARIABLE = "RUNLEDGER_POOL_MODE"
#: Engine execution option holding the engine's :class:`ConnectionPolicy`.
POLICY_OPTION = "runledger_connection_policy"
#: The older, documented switch: False means "no prepared statements", which is
#: what transaction pooling needs, so it reads as the transaction pool mode.
PREPARED_STATEMENTS_OPTION = "runledger_prepared_statements"
#: How to set the pool mode everywhere it can be set, for messages and logs.
SETTING_NAMES = (
    f"{POOL_MODE_VARIABLE}=transaction (runledger-sync --pool-mode transaction; Flask app.config"
    f"['{POOL_MODE_VARIABLE}']; Django RUNLEDGER['POOL_MODE']; rl.create_engine(pool_mode='transaction'))"
)


class PoolMode(str, enum.Enum):
    """How the connections of an engine reach PostgreSQL.

    ``SESSION``: each connection keeps its own server session (a direct connection,
    or PgBouncer ``pool_mode = session``). ``TRANSACTION``: sessions are shared
    between clients from one transaction to the next (PgBouncer ``pool_mode =
    transaction``); the store then prepares nothing and workers do not LISTEN.
    """

    SESSION = "session"
    TRANSACTION = "transaction"


DEFAULT_POOL_MODE = PoolMode.SESSION


def parse_pool_mode(value: Any, *, source: str = "pool_mode") -> PoolMode:
    """Return the PoolMode named by ``value`` (case and surrounding blanks ignored).

    Raises:
        ConfigError: ``value`` names no pool mode; the message lists the allowed ones.
    """
    if isinstance(value, PoolMode):
        return value
    text = value.strip().lower() if isinstance(value, str) else value
    try:
        return PoolMode(text)
    except ValueError:
        allowed = ", ".join(mode.value for mode in PoolMode)
        raise ConfigError([f"{source} must be one of {allowed}, got {value!r}"]) from None


def pool_mode_from_env(environ: Optional[Mapping[str, str]] = None) -> Optional[PoolMode]:
    """Return the pool mode RUNLEDGER_POOL_MODE names, or None when it is unset or blank.

    Raises:
        ConfigError: the variable names no pool mode.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(POOL_MODE_VARIABLE, "").strip()
    return parse_pool_mode(value, source=POOL_MODE_VARIABLE) if value else None


class ConnectionPolicy:
    """One engine's pool mode, and whether its sessions turned out to be shared after all.

    Engines derived from one (``engine.execution_options(...)``, ``rl.with_schema``)
    share the object, so what one of them learns holds for all: they share the pool.
    """

    def __init__(self, mode: PoolMode) -> None:
        self.mode = mode
        self._set_shared(mode is PoolMode.TRANSACTION)
        self._lock = threading.Lock()

    def _set_shared(self, shared: bool) -> None:
        # Plain attributes, not properties: the store reads them at every transaction.
        #: True when a session may serve other clients between our transactions (configured or detected).
        self.sessions_shared = shared
        #: Whether the store may leave prepared statements on this engine's sessions.
        self.prepares = not shared
        #: Whether a worker on this engine may LISTEN (a shared session would deliver elsewhere).
        self.listens = not shared

    def mark_sessions_shared(self) -> bool:
        """Stop preparing and listening from now on; True only for the call that changed it."""
        with self._lock:
            if self.sessions_shared:
                return False
            self._set_shared(True)
            return True

    def __reduce__(self) -> tuple[Any, ...]:
        # A worker process (--processes) gets the engine's options pickled: it gets
        # a policy of its own, with what this one has learnt, but not its lock.
        return (_restored_policy, (self.mode, self.sessions_shared))

    def __repr__(self) -> str:
        detected = " (shared sessions detected)" if self.sessions_shared and self.mode is PoolMode.SESSION else ""
        return f"ConnectionPolicy({self.mode.value}{detected})"


def _restored_policy(mode: PoolMode, shared: bool) -> ConnectionPolicy:
    policy = ConnectionPolicy(mode)
    if shared:
        policy.mark_sessions_shared()
    return policy


_TRANSACTION_POLICY = ConnectionPolicy(PoolMode.TRANSACTION)
# An engine the application built itself carries no policy of ours; its pool gets
# one on first use, so what is detected on it holds for every engine on that pool.
_policies_by_pool: "weakref.WeakKeyDictionary[Any, ConnectionPolicy]" = weakref.WeakKeyDictionary()
_policies_lock = threading.Lock()


def policy_of(bind: Any) -> ConnectionPolicy:
    """Return the ConnectionPolicy of an Engine or Connection.

    It is the one :func:`runledger_sync.create_engine` set, the transaction
    policy when ``runledger_prepared_statements=False`` is set, or else one kept
    for the bind's connection pool (session mode).
    """
    options = bind.get_execution_options()
    if options.get(PREPARED_STATEMENTS_OPTION, True) is False:
        return _TRANSACTION_POLICY
    policy = options.get(POLICY_OPTION)
    if isinstance(policy, ConnectionPolicy):
        return policy
    pool = bind.engine.pool
    with _policies_lock:
        policy = _policies_by_pool.get(pool)
        if policy is None:
            policy = _policies_by_pool[pool] = ConnectionPolicy(DEFAULT_POOL_MODE)
        return policy
