"""JobHandler: the code that runs one job type, and the adapters the registry builds handlers with.

Users subclass :class:`JobHandler` (or decorate a function with
``@registry.job``, which :class:`FunctionHandler` adapts); :class:`WrappedHandler`
runs another handler inside a context manager for ``JobRegistry.wrapped``.
"""

from __future__ import annotations

import types
from typing import Any, Callable, ContextManager, Mapping, Optional

from runledger_sync.core.coordination import Unique
from runledger_sync.core.errors import InvalidPayload
from runledger_sync.core.payload_models import validated
from runledger_sync.core.types import JobCompletion, JobContext, JobDeadLetterInfo, JobFailure

HandlerFunction = Callable[[JobContext, Any], Optional[JobCompletion]]
DeadLetterHook = Callable[[JobContext, Any, JobDeadLetterInfo], None]
#: ``hook(ctx, payload, exception)``, told of every failed attempt (``JobRegistry.on_failure``).
FailureHook = Callable[[JobContext, Any, BaseException], None]


class JobHandler:
    """Subclass to run one job type; register an instance with :meth:`JobRegistry.register`.

    Example::

        class Export(JobHandler):
            job_type = "reports.export"
            max_attempts = 3

            def execute(self, ctx, payload):
                ...

    Attributes:
        job_type: The type this handler runs (non-blank, at most 255 characters).
        max_attempts: Attempts before dead-lettering; None means the definition default (8).
        timeout_seconds: Per-attempt deadline; None means the default (900).
        priority: Default priority of enqueued jobs; None means 100.
        queue: The queue its jobs join (default ``"default"``); an enqueue may name another.
        retry_on: Exception classes retried (spending an attempt); anything else is
            dead-lettered at once. None means the registry's (default ``(Exception,)``).
        dead_letter_on: Exception classes dead-lettered at once; None means the registry's (default none).
        retry_delay_overrides: Failure code -> retry delay in ms, replacing the backoff.
        max_continuations: How many times one job may continue (snooze); None means 100.
        payload_model: A pydantic model class (the extra ``pydantic``), or None:
            ``execute`` then gets ``payload_model.model_validate(payload)``, and
            ``JobRegistry.enqueue`` refuses a payload the model does not accept.
        unique: A :class:`runledger_sync.Unique` that ``JobRegistry.enqueue`` gives
            the type's jobs enqueued with neither ``unique`` nor ``debounce``; None: none.
    """

    job_type: str
    max_attempts: Optional[int] = None
    timeout_seconds: Optional[int] = None
    priority: Optional[int] = None
    queue: str = "default"
    retry_on: Optional[tuple[type[BaseException], ...]] = None
    dead_letter_on: Optional[tuple[type[BaseException], ...]] = None
    # Read-only, so a subclass cannot mutate the default shared by every handler.
    retry_delay_overrides: Mapping[str, int] = types.MappingProxyType({})
    max_continuations: Optional[int] = None
    payload_model: Any = None
    unique: Optional[Unique] = None

    def execute(self, ctx: JobContext, payload: Any) -> Optional[JobCompletion]:
        """Run one attempt of the job.

        Args:
            ctx: The attempt's identity and cancellation flag.
            payload: The job's JSON payload.

        Returns:
            None or a :class:`JobCompletion` on success.

        Raises:
            JobFailure: To choose the outcome (retryable, terminal, timeout).
        """
        raise NotImplementedError(f"{type(self).__name__}.execute is not implemented")

    def on_dead_letter(self, ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        """React to the job being dead-lettered; the default does nothing.

        Called once the dead letter is committed, with a timeout; what it raises
        is logged and swallowed.
        """


class FunctionHandler(JobHandler):
    """Adapt a ``fn(ctx, payload)`` registered with ``@registry.job`` to the class form."""

    def __init__(
        self,
        job_type: str,
        fn: HandlerFunction,
        hook: Optional[DeadLetterHook],
        **options: Any,
    ) -> None:
        self.job_type = job_type
        self._fn = fn
        self._hook = hook
        for name, value in options.items():
            setattr(self, name, value)

    def execute(self, ctx: JobContext, payload: Any) -> Optional[JobCompletion]:
        return self._fn(ctx, payload)

    def on_dead_letter(self, ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        if self._hook is not None:
            self._hook(ctx, payload, info)

    def __repr__(self) -> str:
        return f"<job handler {self.job_type!r} -> {getattr(self._fn, '__qualname__', self._fn)!r}>"


class WrappedHandler(JobHandler):
    """Run another handler's execute and on_dead_letter inside a context manager."""

    def __init__(
        self, inner: JobHandler, around: Callable[[], ContextManager[Any]]) -> None:
        self.inner = inner
        self.around = around
        self.job_type = inner.job_type
        self.max_attempts = inner.max_attempts
        self.timeout_seconds = inner.timeout_seconds
        self.priority = inner.priority
        self.queue = inner.queue
        self.retry_on = inner.retry_on
        self.dead_letter_on = inner.dead_letter_on
        self.retry_delay_overrides = inner.retry_delay_overrides
        self.max_continuations = inner.max_continuations
        self.payload_model = inner.payload_model
        self.unique = inner.unique

    def execute(self, ctx: JobContext, payload: Any) -> Optional[JobCompletion]:
        with self.around():
            return self.inner.execute(ctx, payload)

    def on_dead_letter(self, ctx: JobContext, payload: Any, info: JobDeadLetterInfo) -> None:
        with self.around():
            self.inner.on_dead_letter(ctx, payload, info)

    def __repr__(self) -> str:
        return f"<{self.inner!r} inside {self.around!r}>"


def run_execute(handler: JobHandler, ctx: JobContext, payload: Any) -> Optional[JobCompletion]:
    """``handler.execute(ctx, payload)``, the payload given as an instance of the handler's ``payload_model`` if it has one.

    Raises:
        JobFailure: terminal ``job.invalid_payload`` when the model refuses the
            stored payload (the same payload is refused again on every attempt).
    """
    if handler.payload_model is not None:
        try:
            payload = validated(handler.payload_model, payload)
        except InvalidPayload as error:
            raise JobFailure.terminal(error.code, error.message) from None
    return handler.execute(ctx, payload)


def failure_hook_within(hook: FailureHook, around: Callable[[], ContextManager[Any]]) -> FailureHook:
    """``hook`` run inside ``around()``, as a wrapped handler's dead-letter hook is."""

    def within(ctx: JobContext, payload: Any, exception: BaseException) -> None:
        with around():
            hook(ctx, payload, exception)

    return within
