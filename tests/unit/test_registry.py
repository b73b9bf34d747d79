"""JobRegistry: both registration forms, the checks at registration, retry rules, definitions."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from runledger_sync.core.errors import JobCancelled, RegistrationError
from runledger_sync.core.exception_rules import ExceptionRules
from runledger_sync.core.records import JobDefinition
from runledger_sync.core.types import (
    JobCompletion,
    JobContext,
    JobDeadLetterInfo,
    JobDeadLetterReason,
    JobFailure,
)
from runledger_sync.handlers import JobHandler
from runledger_sync.registry import JobRegistry


def make_ctx() -> JobContext:
    return JobContext(job_id=uuid.uuid4(), run_number=1, attempt=1, organization_id=None, worker_id="w")


def dead_letter_info() -> JobDeadLetterInfo:
    return JobDeadLetterInfo(
        failure=JobFailure.terminal("x.bad", "bad"),
        reason=JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE,
        max_attempts=3,
    )


class Export(JobHandler):
    job_type = "reports.export"
    max_attempts = 3
    timeout_seconds = 60
    priority = 5
    retry_on = (TimeoutError,)
    retry_delay_overrides = {"s3.throttled": 2_500}

    def __init__(self) -> None:
        self.dead_letters: list[tuple] = []

    def execute(self, ctx, payload):
        return JobCompletion.success().with_output({"rows": payload["rows"]})

    def on_dead_letter(self, ctx, payload, info):
        self.dead_letters.append((payload, info.reason))


def registration_error(fn, *args, code: str = "registry.invalid_registration", **kwargs) -> RegistrationError:
    with pytest.raises(RegistrationError) as excinfo:
        fn(*args, **kwargs)
    assert excinfo.value.code == code
    return excinfo.value


# --- the decorator ---------------------------------------------------------------


def test_decorator_returns_the_function_unchanged_and_registers_it():
    registry = JobRegistry()

    @registry.job("email.send", max_attempts=5, timeout_seconds=30)
    def send_email(ctx, payload):
        return JobCompletion.success().with_output({"to": payload["to"]})

    assert send_email(make_ctx(), {"to": "a@b.c"}) == JobCompletion(output={"to": "a@b.c"})
    handler = registry.get("email.send")
    assert isinstance(handler, JobHandler)
    assert handler.job_type == "email.send"
    assert (handler.max_attempts, handler.timeout_seconds, handler.priority) == (5, 30, None)
    assert handler.execute(make_ctx(), {"to": "x@y.z"}) == JobCompletion(output={"to": "x@y.z"})
    assert "email.send" in registry and len(registry) == 1


def test_decorated_function_exceptions_pass_through_the_handler():
    registry = JobRegistry()

    @registry.job("t")
    def fails(ctx, payload):
        raise JobFailure.retryable("smtp.busy", "421")

    with pytest.raises(JobFailure) as excinfo:
        registry.get("t").execute(make_ctx(), {})
    assert excinfo.value.code == "smtp.busy"


def test_decorator_dead_letter_hook_is_called_with_its_arguments():
    registry = JobRegistry()
    seen = []

    @registry.job("t", on_dead_letter=lambda ctx, payload, info: seen.append((payload, info.max_attempts)))
    def handler(ctx, payload):
        return None

    registry.get("t").on_dead_letter(make_ctx(), {"k": 1}, dead_letter_info())
    assert seen == [({"k": 1}, 3)]


def test_decorator_without_hook_has_a_no_op_dead_letter():
    registry = JobRegistry()
    registry.job("t")(lambda ctx, payload: None)
    assert registry.get("t").on_dead_letter(make_ctx(), {}, dead_letter_info()) is None


# --- the class form --------------------------------------------------------------


def test_class_form_registers_the_instance_with_its_attributes():
    registry = JobRegistry()
    export = Export()
    assert registry.register(export) is export
    assert registry.get("reports.export") is export
    assert registry.exception_rules("reports.export") == ExceptionRules(retry_on=(TimeoutError,))
    assert registry.retry_delay_override("reports.export", "s3.throttled") == 2_500
    assert export.execute(make_ctx(), {"rows": 4}) == JobCompletion(output={"rows": 4})
    export.on_dead_letter(make_ctx(), {"rows": 1}, dead_letter_info())
    assert export.dead_letters == [({"rows": 1}, JobDeadLetterReason.FAILURE_KIND_NON_RETRYABLE)]


def test_base_handler_defaults():
    class Minimal(JobHandler):
        job_type = "minimal"

        def execute(self, ctx, payload):
            return None

    handler = Minimal()
    assert (handler.max_attempts, handler.timeout_seconds, handler.priority) == (None, None, None)
    # None: the registry's rules (any Exception retries, none is dead-lettered at once).
    assert handler.retry_on is None and handler.dead_letter_on is None and dict(handler.retry_delay_overrides) == {}
    assert handler.on_dead_letter(make_ctx(), {}, dead_letter_info()) is None
    with pytest.raises(TypeError):
        handler.retry_delay_overrides["x"] = 1  # type: ignore[index]


def test_base_execute_is_abstract():
    with pytest.raises(NotImplementedError):
        JobHandler().execute(make_ctx(), {})


def test_handler_that_does_not_implement_execute_is_rejected():
    class NoExecute(JobHandler):
        job_type = "no.execute"

    err = registration_error(JobRegistry().register, NoExecute())
    assert "does not implement execute()" in err.message


def test_register_rejects_non_handlers():
    err = registration_error(JobRegistry().register, lambda ctx, payload: None)
    assert "JobHandler instance" in err.message


# --- registration errors ---------------------------------------------------------


def test_same_type_twice_is_rejected_and_keeps_the_first():
    registry = JobRegistry()
    first = registry.register(Export())
    err = registration_error(registry.register, Export(), code="registry.duplicate_job_type")
    assert "'reports.export' is already registered" in err.message
    err = registration_error(registry.job("reports.export"), lambda ctx, payload: None, code="registry.duplicate_job_type")
    assert "already registered" in err.message
    assert registry.get("reports.export") is first and len(registry) == 1


@pytest.mark.parametrize(
    ("job_type", "fragment"),
    [
        ("", "must not be blank"),
        ("   ", "must not be blank"),
        # None: the function's name, and a lambda has none to use.
        (None, "give the job type of"),
        (42, "must be a string, got 42"),
        ("x" * 256, "at most 255 characters, got 256"),
    ],
)
def test_bad_job_types_are_rejected(job_type, fragment):
    err = registration_error(JobRegistry().job(job_type), lambda ctx, payload: None)
    assert fragment in err.message


def test_job_type_of_255_characters_is_accepted():
    registry = JobRegistry()
    registry.job("x" * 255)(lambda ctx, payload: None)
    assert registry.registered_types() == ["x" * 255]


def test_non_callable_function_is_rejected():
    err = registration_error(JobRegistry().job("t"), "not a function")
    assert err.message == "handler for job type 't' must be callable, got 'not a function'"


def test_non_callable_hook_is_rejected():
    err = registration_error(JobRegistry().job("t", on_dead_letter=3), lambda ctx, payload: None)
    assert "on_dead_letter for job type 't' must be callable" in err.message


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"max_attempts": 0}, "max_attempts for job type 't' must be a positive int, got 0"),
        ({"max_attempts": True}, "max_attempts for job type 't' must be a positive int, got True"),
        ({"max_attempts": 2.0}, "max_attempts for job type 't' must be a positive int, got 2.0"),
        ({"timeout_seconds": -1}, "timeout_seconds for job type 't' must be a positive int, got -1"),
        ({"priority": "high"}, "priority for job type 't' must be an int, got 'high'"),
        (
            {"retry_delay_overrides": {"smtp.busy": 0}},
            "retry_delay_overrides['smtp.busy'] for job type 't' must be a positive int of ms, got 0",
        ),
        ({"retry_delay_overrides": {"smtp.busy": 1.5}}, "must be a positive int of ms, got 1.5"),
        ({"retry_delay_overrides": {"smtp.busy": True}}, "must be a positive int of ms, got True"),
        ({"retry_delay_overrides": {"": 100}}, "has a blank or non-string code ''"),
        ({"retry_delay_overrides": [("a", 1)]}, "must map failure codes to ms"),
    ],
)
def test_bad_options_are_rejected_at_registration(options, fragment):
    registry = JobRegistry()
    err = registration_error(registry.job("t", **options), lambda ctx, payload: None)
    assert fragment in err.message
    assert "t" not in registry  # a rejected handler leaves no trace


@pytest.mark.parametrize("name", ["retry_on", "dead_letter_on"])
@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ((ValueError, "KeyError"), "must hold Exception subclasses, got 'KeyError'"),
        ((JobCancelled,), "must hold Exception subclasses, got <class"),
        ((KeyboardInterrupt,), "must hold Exception subclasses"),
        ((int,), "must hold Exception subclasses, got <class 'int'>"),
        ("ValueError", "must be a tuple of exception classes, got 'ValueError'"),
    ],
)
def test_exception_rules_must_be_exception_classes_for_a_type_and_for_the_registry(name, given, fragment):
    registry = JobRegistry()
    err = registration_error(registry.job("t", **{name: given}), lambda ctx, payload: None,
                             code="registry.invalid_exception_rules")
    assert err.message.startswith(f"{name} for job type 't' ") and fragment in err.message
    assert "t" not in registry
    err = registration_error(JobRegistry, code="registry.invalid_exception_rules", **{name: given})
    assert err.message.startswith(f"{name} for the registry ") and fragment in err.message


def test_single_exception_class_is_accepted_as_retry_on():
    registry = JobRegistry()
    registry.job("t", retry_on=ConnectionError, dead_letter_on=ValueError)(lambda ctx, payload: None)
    assert registry.exception_rules("t") == ExceptionRules(retry_on=(ConnectionError,), dead_letter_on=(ValueError,))


def test_negative_priority_is_allowed():
    registry = JobRegistry()
    registry.job("t", priority=-10)(lambda ctx, payload: None)
    assert registry.definitions() == [JobDefinition("t", default_priority=-10)]


# --- retry rules -----------------------------------------------------------------


def test_override_applies_only_to_its_exact_type_and_code():
    registry = JobRegistry()
    registry.job("email.send", retry_delay_overrides={"smtp.busy": 2_000, "smtp.down": 60_000})(
        lambda ctx, payload: None
    )
    registry.job("sms.send", retry_delay_overrides={"smtp.busy": 7})(lambda ctx, payload: None)
    registry.job("push.send")(lambda ctx, payload: None)

    assert registry.retry_delay_override("email.send", "smtp.busy") == 2_000
    assert registry.retry_delay_override("email.send", "smtp.down") == 60_000
    assert registry.retry_delay_override("sms.send", "smtp.busy") == 7
    assert registry.retry_delay_override("email.send", "smtp.bus") is None
    assert registry.retry_delay_override("email.send", "SMTP.BUSY") is None
    assert registry.retry_delay_override("push.send", "smtp.busy") is None
    assert registry.retry_delay_override("unknown", "smtp.busy") is None


def test_overrides_are_copied_at_registration():
    overrides = {"smtp.busy": 2_000}
    registry = JobRegistry()
    registry.job("t", retry_delay_overrides=overrides)(lambda ctx, payload: None)
    overrides["smtp.busy"] = 1
    assert registry.retry_delay_override("t", "smtp.busy") == 2_000


def test_exception_rules_of_a_type_replace_the_registrys_setting_by_setting():
    registry = JobRegistry(retry_on=(OSError,), dead_letter_on=(FileNotFoundError,))
    registry.job("own.retry_on", retry_on=(KeyError,))(lambda ctx, payload: None)
    registry.job("own.dead_letter_on", dead_letter_on=())(lambda ctx, payload: None)
    assert registry.exception_rules("own.retry_on") == ExceptionRules((KeyError,), (FileNotFoundError,))
    assert registry.exception_rules("own.dead_letter_on") == ExceptionRules((OSError,), ())
    assert registry.exception_rules("unregistered") == ExceptionRules((OSError,), (FileNotFoundError,))


def test_exception_rules_of_an_unregistered_type_are_the_registrys_defaults():
    registry = JobRegistry()
    registry.job("t", retry_on=(ConnectionError, TimeoutError))(lambda ctx, payload: None)
    assert registry.exception_rules("t").retry_on == (ConnectionError, TimeoutError)
    assert registry.exception_rules("other") == ExceptionRules(retry_on=(Exception,), dead_letter_on=())


# --- lookups and definitions -----------------------------------------------------


def test_registered_types_are_sorted_and_get_misses_return_none():
    registry = JobRegistry()
    for job_type in ["zeta", "alpha", "mid.b", "mid.a"]:
        registry.job(job_type)(lambda ctx, payload: None)
    assert registry.registered_types() == ["alpha", "mid.a", "mid.b", "zeta"]
    assert registry.get("missing") is None
    assert "missing" not in registry
    assert len(registry) == 4


def test_empty_registry():
    registry = JobRegistry()
    assert (registry.registered_types(), registry.definitions(), len(registry)) == ([], [], 0)


def test_definitions_fill_defaults_and_sort_by_type():
    registry = JobRegistry()
    registry.register(Export())
    registry.job("email.send", max_attempts=5)(lambda ctx, payload: None)
    registry.job("audit.write", timeout_seconds=10, priority=0)(lambda ctx, payload: None)
    assert registry.definitions() == [
        JobDefinition(
            "audit.write", version=1, max_attempts=8, default_timeout_seconds=10, default_priority=0
        ),
        JobDefinition(
            "email.send", version=1, max_attempts=5, default_timeout_seconds=900, default_priority=100
        ),
        JobDefinition(
            "reports.export", version=1, max_attempts=3, default_timeout_seconds=60, default_priority=5
        ),
    ]
    assert all(d.is_enabled for d in registry.definitions())


def test_wrapped_registry_runs_handlers_inside_the_context_and_keeps_retry_rules():
    import contextlib

    from runledger_sync.core.types import JobContext
    from runledger_sync.registry import JobRegistry

    entered: list[str] = []

    @contextlib.contextmanager
    def around():
        entered.append("enter")
        yield
        entered.append("exit")

    registry = JobRegistry()

    @registry.job("wrap.me", max_attempts=3, retry_on=(ConnectionError,), retry_delay_overrides={"x.busy": 250})
    def handler(ctx, payload):
        entered.append(f"run {payload['n']}")

    wrapped = registry.wrapped(around)
    ctx = JobContext(job_id=__import__("uuid").uuid4(), run_number=1, attempt=1, organization_id=None, worker_id="w")
    wrapped.get("wrap.me").execute(ctx, {"n": 1})
    assert entered == ["enter", "run 1", "exit"]
    assert wrapped.registered_types() == ["wrap.me"]
    assert wrapped.exception_rules("wrap.me") == registry.exception_rules("wrap.me")
    assert wrapped.retry_delay_override("wrap.me", "x.busy") == 250
    assert wrapped.definitions() == registry.definitions()
    assert len(registry) == 1 and registry.get("wrap.me") is not wrapped.get("wrap.me")


def test_a_wrapped_registry_keeps_the_registrys_own_exception_rules():
    registry = JobRegistry(dead_letter_on=ValueError)
    registry.job("t")(lambda ctx, payload: None)
    wrapped = registry.wrapped(contextlib.nullcontext)
    assert wrapped.exception_rules("t") == wrapped.exception_rules_default == ExceptionRules((Exception,), (ValueError,))


def test_failure_hooks_are_kept_in_order_and_a_wrapped_registry_runs_them_inside_its_wrapper():
    registry = JobRegistry()
    seen: list[str] = []
    first = registry.on_failure(lambda ctx, payload, exception: seen.append(f"first {exception}"))
    registry.on_failure(lambda ctx, payload, exception: seen.append("second"))

    @contextlib.contextmanager
    def around():
        seen.append("enter")
        yield
        seen.append("exit")

    assert registry.failure_hooks[0] is first and len(registry.failure_hooks) == 2
    for hook in registry.wrapped(around).failure_hooks:
        hook(make_ctx(), {}, KeyError("k"))
    assert seen == ["enter", "first 'k'", "exit", "enter", "second", "exit"]


def test_a_failure_hook_that_cannot_be_called_is_refused():
    with pytest.raises(RegistrationError, match="on_failure takes a callable"):
        JobRegistry().on_failure("not a function")
