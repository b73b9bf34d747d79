"""What a registry runs around its jobs: middleware around every attempt's handler, hooks at enqueue.

Middleware is ``fn(ctx, payload, call_next)``. The first registered is the
outermost: it runs first, and ``call_next(ctx, payload)`` runs the next one,
then the handler. Whatever the chain returns or raises is the handler's
outcome, under the same rules (a :class:`~runledger_sync.JobFailure` chooses
it, any other exception retries unless ``dead_letter_on`` or ``retry_on`` stops it); a middleware that returns
without calling ``call_next`` decides the outcome without running the handler.
Each attempt runs its own chain with its own context, on its own thread.

An enqueue hook is ``fn(spec)`` returning metadata to add to the job (or None).
Hooks run in registration order, only on the registry's own enqueue paths
(:meth:`JobRegistry.enqueue`, :meth:`JobRegistry.enqueue_many`,
:meth:`JobRegistry.enqueue_workflow`): a plain ``rl.enqueue`` knows no
registry. A key the caller gave, or an earlier hook added, keeps its value.

A workflow's meta belongs to its run, and every step's job carries it. So for
a workflow the hooks see each job step in turn, in the order the steps were
added, as a :class:`~runledger_sync.JobSpec` of the step's type, payload and
options with the run's meta so far; what they add goes to the run's meta, under
the same rule (the first value a key gets stays). External steps run no hook.

Instrumentation that must see every job of the process, whichever registry (or
none) is involved, installs process-wide hooks instead
(:mod:`runledger_sync.core.instrumentation`); their middleware runs outside
every registry's own.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Callable, ContextManager, Mapping, Optional

from runledger_sync.core import instrumentation
from runledger_sync.core.errors import InvalidArgument, InvalidMeta, RegistrationError
from runledger_sync.core.meta import merged_meta
from runledger_sync.core.payload_models import is_model_instance, validated
from runledger_sync.core.records import JobSpec
from runledger_sync.core.types import JobContext
from runledger_sync.core.workflow import Workflow, WorkflowStepKind
from runledger_sync.handlers import FailureHook

#: ``call_next(ctx, payload)``: the rest of the chain, then the handler.
CallNext = Callable[[JobContext, Any], Any]
Middleware = Callable[[JobContext, Any, CallNext], Any]
#: ``hook(spec)``: metadata to add to the job about to be enqueued, or None.
EnqueueHook = Callable[[JobSpec], Optional[Mapping[str, str]]]


class RegistryHooks:
    """A registry's middleware and enqueue hooks, in registration order."""

    def __init__(self) -> None:
        self.middleware: list[Middleware] = []
        self.enqueue_hooks: list[EnqueueHook] = []

    def add_middleware(self, fn: Middleware) -> Middleware:
        _check_callable("middleware", fn, "fn(ctx, payload, call_next)", 3)
        self.middleware.append(fn)
        return fn

    def add_enqueue_hook(self, fn: EnqueueHook) -> EnqueueHook:
        _check_callable("on_enqueue", fn, "fn(spec)", 1)
        self.enqueue_hooks.append(fn)
        return fn

    def run(self, execute: Callable[[JobContext, Any], Any], ctx: JobContext, payload: Any) -> Any:
        """Call ``execute(ctx, payload)`` inside every middleware, the first registered outermost."""
        if not self.middleware and not instrumentation.process_middleware:
            return execute(ctx, payload)
        # The process's instrumentation (runledger_sync.core.instrumentation) runs outside the registry's own.
        chain = [*instrumentation.process_middleware, *self.middleware]

        def step(index: int) -> CallNext:
            def call_next(given_ctx: JobContext, given_payload: Any) -> Any:
                # The chain serves one attempt: another job's context would let the
                # handler report progress or complete under a lease it does not hold.
                if given_ctx is not ctx:
                    raise InvalidArgument("call_next's ctx", type(given_ctx).__name__, "the attempt's own JobContext")
                if index == len(chain):
                    return execute(given_ctx, given_payload)
                return chain[index](given_ctx, given_payload, step(index + 1))

            return call_next

        return step(0)(ctx, payload)

    def prepared(self, spec: Any, payload_models: Mapping[str, Any]) -> Any:
        """``spec`` with its payload checked against its type's model, and the hooks' metadata added.

        Anything but a JobSpec is passed on as given, for the store to refuse by its position.
        """
        if not isinstance(spec, JobSpec):
            return spec
        model = payload_models.get(spec.job_type)
        if model is not None:
            spec = dataclasses.replace(spec, payload=_typed(model, spec.payload, "payload"))
        return self._with_hooks_meta(spec)

    def prepared_workflow(self, workflow: Workflow, payload_models: Mapping[str, Any]) -> Workflow:
        """A copy of ``workflow``: each job step's payload checked against its type's model, the hooks' metadata in the run's meta.

        Anything but a Workflow is passed on as given, for the store to refuse.
        """
        if not isinstance(workflow, Workflow):
            return workflow
        steps, meta = [], workflow.meta
        for step in workflow.steps:
            job_type = step.job_type
            if step.kind is WorkflowStepKind.JOB and job_type is not None:
                model = payload_models.get(job_type)
                if model is not None:
                    step = dataclasses.replace(step, payload=_typed(model, step.payload, f"the payload of step {step.key!r}"))
                meta = self._with_hooks_meta(JobSpec(
                    job_type, step.payload, priority=step.priority, max_attempts=step.max_attempts,
                    timeout_seconds=step.timeout_seconds, organization_id=workflow.organization_id, meta=meta,
                )).meta
            steps.append(step)
        # A copy, so the caller's workflow is left as built and may be enqueued again.
        prepared = copy.copy(workflow)
        prepared._steps = steps
        prepared.meta = meta
        return prepared

    def _with_hooks_meta(self, spec: JobSpec) -> JobSpec:
        for hook in self.enqueue_hooks:
            added = hook(spec)
            if added is not None and not isinstance(added, Mapping):
                raise InvalidMeta("what an on_enqueue hook returns", added, "a mapping of str keys to str values or None")
            spec = dataclasses.replace(spec, meta=merged_meta(spec.meta, added))
        return spec

    def within(self, around: Callable[[], ContextManager[Any]]) -> "RegistryHooks":
        """The same hooks, each middleware run inside ``around()`` as a wrapped registry's handlers are."""
        copied = RegistryHooks()
        copied.enqueue_hooks = list(self.enqueue_hooks)
        copied.middleware = [_within(fn, around) for fn in self.middleware]
        return copied


class Hooked:
    """What a registry runs around its jobs (the base of :class:`runledger_sync.JobRegistry`)."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks = RegistryHooks()
        self._failure_hooks: list[FailureHook] = []

    def middleware(self, fn: Middleware) -> Middleware:
        """Run ``fn(ctx, payload, call_next)`` around every attempt's handler (see :mod:`runledger_sync.middleware`).

        Returns:
            ``fn``, unchanged: it works as a decorator.

        Raises:
            RegistrationError: ``fn`` is not a plain callable of three arguments.

        Example::

            @registry.middleware
            def with_tenant(ctx, payload, call_next):
                with tenant(ctx.meta.get("tenant")):
                    return call_next(ctx, payload)
        """
        return self._hooks.add_middleware(fn)

    def on_enqueue(self, fn: EnqueueHook) -> EnqueueHook:
        """Call ``fn(spec)`` before :meth:`enqueue` writes a job; the mapping it returns is added to the job's meta.

        For :meth:`enqueue_workflow` it is called for each job step, and adds to the run's meta.

        Returns:
            ``fn``, unchanged: it works as a decorator.

        Raises:
            RegistrationError: ``fn`` is not a plain callable of one argument.
        """
        return self._hooks.add_enqueue_hook(fn)

    @property
    def hooks(self) -> RegistryHooks:
        """The middleware and enqueue hooks (the worker runs every attempt through ``hooks.run``)."""
        return self._hooks

    def on_failure(self, hook: FailureHook) -> FailureHook:
        """Call ``hook(ctx, payload, exception)`` for every failed attempt of any of the registry's job types.

        ``exception`` is what the handler raised (its ``__traceback__`` intact);
        for a failure it raised nothing for (a timeout, an invalid result) it is
        the :class:`~runledger_sync.JobFailure` recorded, whose kind, code and
        message say what happened. The hook runs once the failure (a retry or a
        dead letter) is durable, on a thread of its own, before the job's
        dead-letter hook, bounded by ``JobsConfig.dead_letter_hook_timeout_seconds``
        as that one is; what it raises is logged and swallowed. An attempt whose
        lease was lost is recorded by the reaper instead, and not told.

        Args:
            hook: Called with the attempt's context, the job's payload and the exception.

        Returns:
            ``hook``, unchanged: it works as a decorator.

        Raises:
            RegistrationError: ``hook`` is not callable.

        Example::

            @registry.on_failure
            def report(ctx, payload, exception):
                sentry_sdk.capture_exception(exception)
        """
        if not callable(hook):
            raise RegistrationError(f"on_failure takes a callable hook(ctx, payload, exception), got {hook!r}")
        self._failure_hooks.append(hook)
        return hook

    @property
    def failure_hooks(self) -> tuple[FailureHook, ...]:
        """The hooks given to :meth:`on_failure`, in the order they were given."""
        return tuple(self._failure_hooks)


def _typed(model: Any, payload: Any, argument: str) -> Any:
    """The JSON dump of ``model.model_validate(payload)``: what the job row will hold."""
    # An instance is checked as its dump, which is what the job row would otherwise hold.
    given = payload.model_dump(mode="json", warnings=False) if is_model_instance(payload) else payload
    return validated(model, {} if given is None else given, argument).model_dump(mode="json")


def _within(fn: Middleware, around: Callable[[], ContextManager[Any]]) -> Middleware:
    def within(ctx: JobContext, payload: Any, call_next: CallNext) -> Any:
        with around():
            return fn(ctx, payload, call_next)

    return within


def _check_callable(what: str, fn: Any, shape: str, arguments: int) -> None:
    if not callable(fn):
        raise RegistrationError(f"{what} takes a callable {shape}, got {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise RegistrationError(f"{what} takes a plain callable {shape}, got an async function: the worker "
                                "runs jobs on threads and would only get a coroutine back")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: it is the caller's word
    try:
        signature.bind(*([None] * arguments))
    except TypeError:
        raise RegistrationError(f"{what} takes a callable {shape}; its signature is {signature}") from None
