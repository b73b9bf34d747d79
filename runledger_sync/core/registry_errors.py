"""The registration family of errors: a handler refused when it is registered, at import time."""

from __future__ import annotations

from runledger_sync.core.errors import RegistrationError


class DuplicateJobType(RegistrationError):
    """Another handler is already registered for this job type."""

    code = "registry.duplicate_job_type"


class AsyncHandler(RegistrationError):
    """The handler is a coroutine function: the worker calls handlers in threads and would never run its body."""

    code = "registry.async_handler"


class HandlerSignature(RegistrationError):
    """The handler cannot be called as ``handler(ctx, payload)``."""

    code = "registry.handler_signature"


class UndeclaredQueue(RegistrationError):
    """A job type names a queue that is neither the default, declared with ``registry.queue``, nor created."""

    code = "registry.undeclared_queue"


class InvalidPayloadModel(RegistrationError):
    """``payload_model`` is not a pydantic model class."""

    code = "registry.invalid_payload_model"


class InvalidExceptionRules(RegistrationError):
    """``retry_on`` or ``dead_letter_on`` is not a tuple of Exception subclasses."""

    code = "registry.invalid_exception_rules"
