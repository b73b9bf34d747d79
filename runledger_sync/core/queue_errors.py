"""The flow-control family of errors: queue names, settings, concurrency keys."""

from __future__ import annotations

from runledger_sync.core.errors import InvalidArgument, JobStateError


class InvalidQueueName(InvalidArgument):
    """A queue name is blank, too long, or not text."""

    code = "queue.invalid_name"


class InvalidQueueSetting(InvalidArgument):
    """A queue limit is not a positive whole number, or a rate limit is not a positive count per positive period."""

    code = "queue.invalid_setting"


class InvalidConcurrencyKey(InvalidArgument):
    """A concurrency key (the spec's execution resource key) is blank or longer than 512 bytes."""

    code = "job.invalid_execution_resource_key"


class QueueNotFound(JobStateError):
    """No queue has this name: declare it with ``registry.queue`` and sync, or create it with ``configure_queue``."""

    code = "queue.not_found"
