"""The registry's checks: what a handler and its options must be, checked when it is registered.

A mistake then fails when the module that registers is imported, not when a
worker first meets a job. The worker calls ``handler(ctx, payload)`` on a
thread of its own and reads what it returns, so a handler must be a plain (not
``async def``) callable that takes two positional arguments; each check raises
its own code.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from runledger_sync.core.errors import RegistrationError, ValidationError
from runledger_sync.core.payload_models import is_model_class
from runledger_sync.core.registry_errors import AsyncHandler, HandlerSignature, InvalidPayloadModel
from runledger_sync.core.validation import check_job_type

#: The longest job type a definition row accepts.
MAX_JOB_TYPE_LENGTH = 255


def check_handler(job_type: str, handler: Any, what: str = "handler") -> None:
    """Refuse what the worker cannot call as ``handler(ctx, payload)``.

    Args:
        what: how the messages name it (``handler``, or ``execute()`` of a JobHandler).

    Raises:
        RegistrationError: not callable.
        AsyncHandler: an ``async def`` function (or generator): calling it would
            only make a coroutine, and the job would succeed without running.
        HandlerSignature: its signature cannot bind two positional arguments.
    """
    if not callable(handler):
        raise RegistrationError(f"{what} for job type {job_type!r} must be callable, got {handler!r}")
    if _is_async(handler):
        raise AsyncHandler(
            f"{what} for job type {job_type!r} is an async function; the worker runs handlers on threads and "
            "would only get a coroutine back: write it as a plain def (run async code inside it with asyncio.run)",
            job_type=job_type,
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # a builtin or extension callable without a signature: it is the caller's word
    try:
        signature.bind(None, None)
    except TypeError as error:
        raise HandlerSignature(
            f"{what} for job type {job_type!r} cannot be called as {what.removesuffix('()')}(ctx, payload): "
            f"its signature is {signature} ({error})",
            job_type=job_type,
        ) from None


def check_payload_model(job_type: str, model: Any) -> None:
    """Refuse a ``payload_model`` that is not a pydantic model class.

    Raises:
        InvalidPayloadModel: anything else (a dataclass, an instance, a model of pydantic 1).
    """
    if model is not None and not is_model_class(model):
        raise InvalidPayloadModel(
            f"payload_model for job type {job_type!r} must be a pydantic BaseModel subclass (pydantic 2, the "
            f"extra 'pydantic'), got {model!r}",
            job_type=job_type,
        )


def default_job_type(fn: Any) -> str:
    """The job type of a handler registered without one: its function's name.

    Raises:
        RegistrationError: it has no name to use (a lambda, a callable object).
    """
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise RegistrationError(
            f"give the job type of {fn!r}: @registry.job(\"area.name\") (only a named function's name is used "
            "when none is given)"
        )
    return name


def checked_job_type(job_type: Any, handler: Any) -> str:
    if not isinstance(job_type, str):
        raise RegistrationError(f"job_type of {handler!r} must be a string, got {job_type!r}")
    if not job_type.strip():
        raise RegistrationError(f"job_type of {handler!r} must not be blank")
    if len(job_type) > MAX_JOB_TYPE_LENGTH:
        raise RegistrationError(
            f"job_type must be at most {MAX_JOB_TYPE_LENGTH} characters, "
            f"got {len(job_type)}: {job_type[:40]!r}..."
        )
    try:
        # The store's own rule, so a type that registers is one the database can hold.
        return check_job_type(job_type)
    except ValidationError as error:
        raise RegistrationError(f"job_type of {handler!r} cannot be stored: {error.message}") from error


def check_optional_positive_int(job_type: str, name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RegistrationError(f"{name} for job type {job_type!r} must be a positive int, got {value!r}")


def checked_overrides(job_type: str, overrides: Any) -> dict[str, int]:
    if not isinstance(overrides, Mapping):
        raise RegistrationError(
            f"retry_delay_overrides for job type {job_type!r} must map failure codes to ms, got {overrides!r}"
        )
    for code, delay_ms in overrides.items():
        if not isinstance(code, str) or not code.strip():
            raise RegistrationError(
                f"retry_delay_overrides for job type {job_type!r} has a blank or non-string code {code!r}"
            )
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 1:
            raise RegistrationError(
                f"retry_delay_overrides[{code!r}] for job type {job_type!r} must be a positive int of ms, "
                f"got {delay_ms!r}"
            )
    return dict(overrides)


def _is_async(handler: Any) -> bool:
    # A callable object's __call__ counts too, and so does a functools.partial of one.
    call = handler if inspect.isroutine(handler) else handler.__call__
    return any(check(target) for target in (handler, call)
               for check in (inspect.iscoroutinefunction, inspect.isasyncgenfunction))
