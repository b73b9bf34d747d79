"""The replay family of errors (spec section 12, ``job.replay_*``): a replay's key and reason, and its idempotency."""

from __future__ import annotations

from runledger_sync.core.errors import ConflictError, InvalidArgument


class ReplayKeyBlank(InvalidArgument):
    """A replay needs a key that is not blank: it names the replay, so a repeated request requeues nothing more."""

    code = "job.replay_key_blank"


class ReplayKeyTooLong(InvalidArgument):
    """A replay key is longer than 255 characters."""

    code = "job.replay_key_too_long"


class ReplayReasonBlank(InvalidArgument):
    """A replay needs a reason that is not blank: it is what the audit trail says the job was run again for."""

    code = "job.replay_reason_blank"


class ReplayIdempotencyConflict(ConflictError):
    """This job was already replayed with this key for a different request (reason, actor or expectations)."""

    code = "job.replay_idempotency_conflict"


class ReplayIdempotencyConflictMissingExisting(ConflictError):
    """The replay key conflicted but the replay recorded with it could not be found."""

    code = "job.replay_idempotency_conflict_missing_existing"
    category = "internal"
