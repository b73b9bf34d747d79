"""The batch family of errors: an unknown batch, one that takes no more members, a bad callback.

The tree is drawn in :mod:`runledger_sync.core.errors`; import these classes from
here (or from ``runledger_sync``).
"""

from __future__ import annotations

from runledger_sync.core.errors import JobStateError, ValidationError


class InvalidBatchCallback(ValidationError):
    """A batch callback is refused: not a (job type, payload) pair, or its payload is not a JSON object."""

    code = "batch.invalid_callback"


class BatchNotFound(JobStateError):
    """No batch has this id."""

    code = "batch.not_found"


class BatchClosed(JobStateError):
    """The batch takes no more members and cannot be closed again: it is closed, finished or canceled."""

    code = "batch.closed"


class BatchFinished(JobStateError):
    """The batch has finished (or was canceled): it cannot be canceled."""

    code = "batch.finished"
