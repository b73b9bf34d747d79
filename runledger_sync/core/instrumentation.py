"""Process-wide instrumentation: hooks an integration installs once for every enqueue and every attempt.

A registry's own hooks (``registry.middleware``, ``registry.on_enqueue``) serve
that registry's jobs. Tracing must see every job a process writes, through
``rl.enqueue`` too, and every attempt a worker runs, whichever registry it
serves: an integration such as :mod:`runledger_sync.contrib.opentelemetry`
installs its hooks here, and :func:`install` gives back the function that
removes them.

- An enqueue observer is ``observer(name, id, meta)``, called once per job
  (``name`` its type, ``id`` the id drawn for it) and once per workflow run
  (its name and run id) before anything is written; the mapping it returns (or
  None) is added to the metadata, under the keys already there.
- A process middleware is a middleware (``fn(ctx, payload, call_next)``) that
  runs outside every registry's own.

Install at startup, before enqueuing or starting workers: the lists are read
without a lock, and replaced whole by each change.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional

EnqueueObserver = Callable[[str, str, Optional[Mapping[str, str]]], Optional[Mapping[str, str]]]
ProcessMiddleware = Callable[[Any, Any, Callable[[Any, Any], Any]], Any]

_lock = threading.Lock()
#: Replaced whole, never changed in place, so a reader needs no lock.
enqueue_observers: tuple[EnqueueObserver, ...] = ()
process_middleware: tuple[ProcessMiddleware, ...] = ()


def install(*, on_enqueue: Optional[EnqueueObserver] = None,
            middleware: Optional[ProcessMiddleware] = None) -> Callable[[], None]:
    """Add an enqueue observer and a process middleware; return the function that removes both."""
    global enqueue_observers, process_middleware
    with _lock:
        if on_enqueue is not None:
            enqueue_observers = (*enqueue_observers, on_enqueue)
        if middleware is not None:
            process_middleware = (*process_middleware, middleware)

    def uninstall() -> None:
        global enqueue_observers, process_middleware
        with _lock:
            enqueue_observers = tuple(fn for fn in enqueue_observers if fn is not on_enqueue)
            process_middleware = tuple(fn for fn in process_middleware if fn is not middleware)

    return uninstall


def observed_meta(name: str, id_text: str, meta: Optional[Mapping[str, str]]) -> Optional[Mapping[str, str]]:
    """``meta`` (already checked) with what every enqueue observer adds (a key already there keeps its value)."""
    for observer in enqueue_observers:
        added = observer(name, id_text, meta)
        if added:
            meta = {**added, **(meta or {})}
    return meta
