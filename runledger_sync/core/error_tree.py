"""Every coded error class: for the check that codes are unique and for the docs' errors page.

The walk follows ``__subclasses__``, which knows a class only once its module is
loaded; this module imports every family so that none is missed (the families
import their bases from :mod:`runledger_sync.core.errors`, so that module cannot).
"""

from __future__ import annotations

from runledger_sync.core import (  # noqa: F401 - loaded for the walk
    batch_errors,
    bulk_errors,
    dashboard_errors,
    encryption_errors,
    queue_errors,
    registry_errors,
    replay_errors,
    store_errors,
    workflow_errors,
)
from runledger_sync.core.errors import JobCancelled, RunledgerError


def all_error_classes() -> list[type]:
    """Return every coded error class, the base first."""
    found: list[type] = [JobCancelled]
    pending: list[type] = [RunledgerError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
