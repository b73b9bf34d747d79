"""JobRegistry: which code runs for which job type, with its retry rules and declared schedules.

The handler classes (:class:`JobHandler` and the adapters the registry wraps
functions and handlers in) are in :mod:`runledger_sync.handlers`; its hooks
(middleware, enqueue and failure hooks) in :mod:`runledger_sync.middleware`, its
declared queues and schedules in :mod:`runledger_sync.declarations`.

Register handlers once at startup, before the worker starts; the worker only
reads the registry afterwards, so it needs no lock.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ContextManager, Mapping, Optional, overload

from runledger_sync.core.coordination import Unique
from runledger_sync.core.errors import InvalidArgument, RegistrationError
from runledger_sync.core.exception_rules import ExceptionRules
from runledger_sync.core.flow import DEFAULT_QUEUE, check_queue_name
from runledger_sync.core.handler_checks import (
    check_handler,
    check_optional_positive_int,
    check_payload_model,
    checked_job_type,
    checked_overrides,
    default_job_type,
)
from runledger_sync.core.records import JobDefinition, JobRecord, JobSpec
from runledger_sync.core.registry_errors import DuplicateJobType
from runledger_sync.declarations import Declarations
from runledger_sync.handlers import (
    DeadLetterHook,
    FunctionHandler,
    HandlerFunction,
    JobHandler,
    WrappedHandler,
    failure_hook_within,
)
from runledger_sync.logging import get_logger
from runledger_sync.middleware import Hooked

log = get_logger(__name__)

class JobRegistry(Declarations, Hooked):
    """Map job types to handlers, with their retry rules.

    A handler's uncaught exception is a retryable failure that spends one of the
    job's ``max_attempts`` (code ``job.handler_exception``), with backoff; once
    they are spent the job is dead-lettered (attempts exhausted). An exception
    in ``dead_letter_on``, or outside ``retry_on`` when that is narrowed, is
    dead-lettered at once (PANICKED, ``job.handler_panic``). Only a lost
    connection to the queue database spends no attempt (``job.handler_transient_error``,
    at most 20 in a row, about 15 minutes). See
    :mod:`runledger_sync.core.exception_rules`.

    Args:
        retry_on: Exception classes (or one class) retried for every type; default
            ``(Exception,)``. Anything outside it is dead-lettered at once.
        dead_letter_on: Exception classes (or one class) dead-lettered at once for
            every type; default none. A type's own ``retry_on`` or
            ``dead_letter_on`` replaces the registry's.

    Raises:
        InvalidExceptionRules: ``registry.invalid_exception_rules``, a setting holds
            anything but Exception subclasses.

    Example::

        registry = JobRegistry(dead_letter_on=(ValueError,))

        @registry.job("email.send", max_attempts=5, dead_letter_on=(InvalidAddress,))
        def send_email(ctx, payload):
            ...
    """

    def __init__(self, *, retry_on: Any = None, dead_letter_on: Any = None) -> None:
        #: The rules of every type that does not give its own.
        self.exception_rules_default = ExceptionRules.checked(
            "for the registry", retry_on=retry_on, dead_letter_on=dead_letter_on)
        super().__init__()
        self._handlers: dict[str, JobHandler] = {}
        self._exception_rules: dict[str, ExceptionRules] = {}
        self._overrides: dict[str, dict[str, int]] = {}
        self._payload_models: dict[str, Any] = {}
        self._unique: dict[str, Unique] = {}

    @overload
    def job(self, job_type: HandlerFunction, /) -> HandlerFunction: ...
    @overload
    def job(
        self, job_type: Optional[str] = None, *, max_attempts: Optional[int] = None,
        timeout_seconds: Optional[int] = None, priority: Optional[int] = None, retry_on: Any = None,
        dead_letter_on: Any = None, retry_delay_overrides: Optional[Mapping[str, int]] = None,
        on_dead_letter: Optional[DeadLetterHook] = None, queue: str = DEFAULT_QUEUE, payload_model: Any = None,
        max_continuations: Optional[int] = None, unique: Optional[Unique] = None,
    ) -> Callable[[HandlerFunction], HandlerFunction]: ...
    def job(
        self, job_type: Any = None, *, max_attempts: Optional[int] = None, timeout_seconds: Optional[int] = None,
        priority: Optional[int] = None, retry_on: Any = None, dead_letter_on: Any = None,
        retry_delay_overrides: Optional[Mapping[str, int]] = None, on_dead_letter: Optional[DeadLetterHook] = None,
        queue: str = DEFAULT_QUEUE, payload_model: Any = None, max_continuations: Optional[int] = None,
        unique: Optional[Unique] = None,
    ) -> Any:
        """Register the decorated ``fn(ctx, payload)`` as the handler of ``job_type``.

        The function is returned unchanged, so tests can still call it directly.
        Used bare (``@registry.job``, or ``@registry.job()``), the job type is the
        function's name. Every mistake the worker would meet later is refused here,
        when the module that registers is imported (see
        :mod:`runledger_sync.core.handler_checks`).

        Args:
            job_type: The type to handle (default: the function's name).
            max_attempts: Attempts before dead-lettering (default 8).
            timeout_seconds: Per-attempt deadline (default 900).
            priority: Default priority of the type's definition (default 100).
            retry_on: Exception classes (or one class) retried, spending an attempt;
                anything else is dead-lettered at once (default: the registry's, ``(Exception,)``).
            dead_letter_on: Exception classes (or one class) dead-lettered at once,
                even when ``retry_on`` holds them (default: the registry's, none).
            retry_delay_overrides: Failure code -> delay in ms for this type only.
            on_dead_letter: ``hook(ctx, payload, info)`` called after a dead letter.
            queue: The queue its jobs join: the default, one declared with :meth:`queue`,
                or one an operator created (:meth:`sync_definitions` refuses any other).
            payload_model: A pydantic model class (the extra ``pydantic``): the
                handler gets ``payload_model.model_validate(payload)``, and
                :meth:`enqueue` refuses a payload it does not accept.
            max_continuations: How many times one job may continue or snooze (default 100).
            unique: The type's :class:`runledger_sync.Unique`, given by :meth:`enqueue` and
                :meth:`enqueue_many` to its jobs enqueued with neither ``unique`` nor ``debounce``.

        Returns:
            A decorator; used bare, the function itself.

        Raises:
            RegistrationError: When the decorator is applied, if any option is
                invalid or the function is not callable; its subclasses
                ``AsyncHandler`` (``registry.async_handler``), ``HandlerSignature``
                (``registry.handler_signature``), ``InvalidExceptionRules``
                (``registry.invalid_exception_rules``), ``DuplicateJobType``
                (``registry.duplicate_job_type``) and ``InvalidPayloadModel``
                (``registry.invalid_payload_model``) for those mistakes.
        """
        if callable(job_type) and not isinstance(job_type, str):
            return self.job()(job_type)

        def decorator(fn: HandlerFunction) -> HandlerFunction:
            name = default_job_type(fn) if job_type is None else job_type
            check_handler(str(name), fn)
            if on_dead_letter is not None and not callable(on_dead_letter):
                raise RegistrationError(
                    f"on_dead_letter for job type {name!r} must be callable, got {on_dead_letter!r}"
                )
            handler = FunctionHandler(
                name,
                fn,
                on_dead_letter,
                max_attempts=max_attempts,
                timeout_seconds=timeout_seconds,
                priority=priority,
                retry_on=retry_on,
                dead_letter_on=dead_letter_on,
                retry_delay_overrides=retry_delay_overrides or {},
                queue=queue,
                payload_model=payload_model,
                max_continuations=max_continuations,
                unique=unique,
            )
            self.register(handler)
            return fn

        return decorator

    def register(self, handler: JobHandler) -> JobHandler:
        """Register a :class:`JobHandler` instance under its ``job_type``.

        Returns:
            The handler, unchanged.

        Raises:
            RegistrationError: The handler or one of its attributes is invalid,
                or its type is already registered.
        """
        if not isinstance(handler, JobHandler):
            raise RegistrationError(f"register() takes a JobHandler instance, got {handler!r}")
        job_type = checked_job_type(getattr(handler, "job_type", None), handler)
        if job_type in self._handlers:
            raise DuplicateJobType(
                f"job type {job_type!r} is already registered to {self._handlers[job_type]!r}", job_type=job_type,
            )
        if type(handler).execute is JobHandler.execute:
            raise RegistrationError(f"handler for job type {job_type!r} does not implement execute()")
        check_handler(job_type, handler.execute, "execute()")
        for name in ("max_attempts", "timeout_seconds", "max_continuations"):
            check_optional_positive_int(job_type, name, getattr(handler, name))
        if handler.priority is not None and (
            isinstance(handler.priority, bool) or not isinstance(handler.priority, int)
        ):
            raise RegistrationError(
                f"priority for job type {job_type!r} must be an int, got {handler.priority!r}"
            )
        try:
            check_queue_name(handler.queue)
        except InvalidArgument as error:
            raise RegistrationError(f"queue for job type {job_type!r}: {error.message}") from None
        rules = ExceptionRules.checked(f"for job type {job_type!r}", retry_on=handler.retry_on,
                                       dead_letter_on=handler.dead_letter_on, defaults=self.exception_rules_default)
        overrides = checked_overrides(job_type, handler.retry_delay_overrides)
        check_payload_model(job_type, handler.payload_model)
        unique = getattr(handler, "unique", None)
        if unique is not None:
            if not isinstance(unique, Unique):
                raise RegistrationError(f"unique for job type {job_type!r} must be an rl.Unique, got {unique!r}")
            try:
                unique.checked()
            except InvalidArgument as error:
                raise RegistrationError(f"unique for job type {job_type!r}: {error.message}") from None
        # Every check passed: only now mutate, so a rejected handler leaves no trace.
        self._handlers[job_type] = handler
        if handler.payload_model is not None:
            self._payload_models[job_type] = handler.payload_model
        if unique is not None:
            self._unique[job_type] = unique
        self._exception_rules[job_type] = rules
        self._overrides[job_type] = overrides
        return handler

    def enqueue(self, bind: Any, job_type: str, payload: Any = None, **options: Any) -> JobRecord:
        """Enqueue as :func:`runledger_sync.enqueue` does, checking a typed payload and running the enqueue hooks first.

        For a type registered with ``payload_model=M``, ``payload`` may be an ``M``
        instance or a JSON value ``M`` accepts; the job stores
        ``M.model_validate(payload).model_dump(mode="json")``. Then each
        :meth:`on_enqueue` hook may add metadata. Any error raises before anything is written.

        Args:
            bind: What :func:`runledger_sync.enqueue` takes: an Engine, or a
                connection or session whose transaction the job joins.
            options: :func:`runledger_sync.enqueue`'s keyword arguments.

        Raises:
            InvalidPayload: ``job.invalid_payload``; the message names each field's
                path and what is wrong with it, never the value.
            RunledgerError: whatever :func:`runledger_sync.enqueue` raises.

        Example:
            ``registry.enqueue(engine, "orders.sync", {"order_id": 42}, meta={"tenant": "acme"})``
        """
        # These two are the call's, not the job's: they stay out of its spec.
        call = {name: options.pop(name) for name in ("max_payload_bytes", "event_log") if name in options}
        return self.enqueue_many(bind, [JobSpec(job_type, {} if payload is None else payload, **options)], **call)[0]

    def enqueue_many(self, bind: Any, specs: Any, **options: Any) -> list[JobRecord]:
        """Enqueue as :func:`runledger_sync.enqueue_many` does, preparing each spec as :meth:`enqueue` does."""
        # Imported here: the registry sits below the store (see sync_definitions).
        from runledger_sync.store.enqueue.enqueue import enqueue_many

        if isinstance(specs, (list, tuple)):
            # A list stays a list, which the store may send again after a lost connection.
            return enqueue_many(bind, [self._prepared(spec) for spec in specs], **options)
        return enqueue_many(bind, (self._prepared(spec) for spec in specs), **options)

    def _prepared(self, spec: Any) -> Any:
        spec = self._hooks.prepared(spec, self._payload_models)
        if isinstance(spec, JobSpec) and spec.unique is None and spec.debounce is None:
            unique = self._unique.get(spec.job_type)
            if unique is not None:
                spec = dataclasses.replace(spec, unique=unique)
        return spec

    def enqueue_workflow(self, bind: Any, workflow: Any, **options: Any) -> Any:
        """Enqueue as :func:`runledger_sync.enqueue_workflow` does, checking typed step payloads and running the enqueue hooks first.

        Each job step of a type with a ``payload_model`` has its payload checked
        and stored as :meth:`enqueue` does; the :meth:`on_enqueue` hooks see each
        job step and add to the run's meta, which every step's job carries (see
        :mod:`runledger_sync.middleware`). The workflow given is left unchanged.
        Any error raises before anything is written.

        Args:
            bind: What :func:`runledger_sync.enqueue_workflow` takes.
            options: Its keyword arguments.

        Returns:
            The run with its steps (a :class:`~runledger_sync.WorkflowRunRecord`).

        Raises:
            InvalidPayload: ``job.invalid_payload``; the message names the step
                and each field's path, never the value.
            RunledgerError: whatever :func:`runledger_sync.enqueue_workflow` raises.
        """
        # Imported here: the registry sits below the store (see sync_definitions).
        from runledger_sync.store.workflows.enqueue import enqueue_workflow

        return enqueue_workflow(bind, self._hooks.prepared_workflow(workflow, self._payload_models), **options)

    def get(self, job_type: str) -> Optional[JobHandler]:
        """Return the handler of ``job_type``, or None if none is registered."""
        return self._handlers.get(job_type)

    def registered_types(self) -> list[str]:
        """Return the registered job types, sorted (the order the worker claims them in)."""
        return sorted(self._handlers)

    def retry_delay_override(self, job_type: str, code: str) -> Optional[int]:
        """Return the override delay in ms for this exact (job type, failure code), or None.

        The worker applies it only to retryable failure kinds.
        """
        return self._overrides.get(job_type, {}).get(code)

    def exception_rules(self, job_type: str) -> ExceptionRules:
        """Return the rules that decide which of ``job_type``'s uncaught exceptions retry (the registry's if unregistered)."""
        return self._exception_rules.get(job_type, self.exception_rules_default)

    def definitions(self) -> list[JobDefinition]:
        """Return one :class:`JobDefinition` per registered type, sorted by type.

        Values a handler leaves as None take the definition defaults
        (max_attempts 8, timeout 900 s, priority 100).
        """
        result = []
        for job_type in self.registered_types():
            handler = self._handlers[job_type]
            given: dict[str, Any] = {
                "max_attempts": handler.max_attempts,
                "default_timeout_seconds": handler.timeout_seconds,
                "default_priority": handler.priority,
                "max_continuations": handler.max_continuations,
            }
            given["queue"] = handler.queue
            result.append(JobDefinition(job_type, **{k: v for k, v in given.items() if v is not None}))
        return result

    def sync_definitions(
        self, engine_or_connection: Any, *, overwrite: bool = True, deactivate_undeclared_schedules: bool = False,
    ) -> Any:
        """Write :meth:`definitions` to ``job_definitions``, and the declared :attr:`schedules`.

        A schedule of one of these types that earlier code declared and this code
        no longer does is logged as a warning; it is paused only with
        ``deactivate_undeclared_schedules``.

        Args:
            engine_or_connection: An Engine (commits itself) or a Connection (joins its transaction).
            overwrite: Replace existing definition rows (True) or insert only missing ones.

        Returns:
            What :func:`runledger_sync.store.definitions.sync_job_definitions` returns.

        Raises:
            UndeclaredQueue: a handler names a queue that is not the default, not
                declared with :meth:`queue` and not in the database (a typo would
                otherwise create a queue without limits); nothing is written.
            DefinitionNotFound: a declared schedule names a job type with no definition;
                the message names the schedule and the type, and no schedule is written.
        """
        # Imported here, not at module level: the registry sits below the store in
        # the layering, and the store must stay importable without the registry.
        from runledger_sync.store.definitions import sync_job_definitions
        from runledger_sync.store.queues import list_queues, sync_queues
        from runledger_sync.store.schedules import sync_declared_schedules

        self.check_queues_named({job_type: handler.queue for job_type, handler in self._handlers.items()},
                                (queue.name for queue in list_queues(engine_or_connection)))
        # Queues first: a definition names its queue.
        sync_queues(engine_or_connection, self.queues)
        definitions = sync_job_definitions(engine_or_connection, self.definitions(), overwrite=overwrite)
        synced = sync_declared_schedules(
            engine_or_connection, self.schedules, job_types=self.registered_types(),
            deactivate_undeclared=deactivate_undeclared_schedules,
        )
        if synced.undeclared:
            log.warning(
                "schedules declared by earlier code are no longer declared"
                + ("; paused" if synced.deactivated else "; still active (pause them, delete them with force=True,"
                   " or pass deactivate_undeclared_schedules=True)"),
                extra={"schedule_names": [s.name for s in synced.undeclared]},
            )
        return definitions

    def wrapped(self, around: Callable[[], ContextManager[Any]]) -> "JobRegistry":
        """Return a new registry whose handlers run inside ``around()`` (a context manager factory).

        Integrations use it to give every handler (and hook) its framework's
        surroundings (an app context, fresh database connections). Types, retry
        rules and definitions stay those of this registry, which is left unchanged.

        Example:
            ``registry.wrapped(app.app_context)``
        """
        wrapped = JobRegistry()
        wrapped.exception_rules_default = self.exception_rules_default
        wrapped._schedules = dict(self._schedules)
        wrapped._queues = dict(self._queues)
        wrapped._failure_hooks = [failure_hook_within(hook, around) for hook in self._failure_hooks]
        for handler in self._handlers.values():
            wrapped.register(WrappedHandler(handler, around))
        wrapped._hooks = self._hooks.within(around)
        return wrapped

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)

    def __repr__(self) -> str:
        return f"<JobRegistry {self.registered_types()!r}>"
