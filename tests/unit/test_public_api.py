"""The public namespace is exactly ``__all__``, kept sorted (users import from it)."""

import types

import runledger_sync as rl
from runledger_sync import errors
from runledger_sync.core.error_tree import all_error_classes

ARCHITECTURE_NAMES = {
    "create_engine", "migrate", "check_schema", "JobRegistry", "JobHandler", "JobContext", "JobCompletion",
    "JobFailure", "JobDeadLetterInfo", "enqueue", "enqueue_many", "JobSpec", "get_job", "list_jobs",
    "cancel_job", "requeue_job", "JobsConfig", "Supervisor", "run_worker_loop", "RuntimeLoopExit", "JobRecord",
    "InvalidPayload", "RunledgerError",
}


def test_all_is_sorted_and_unique():
    assert rl.__all__ == sorted(set(rl.__all__))


def test_all_names_exactly_the_public_namespace():
    public = {
        name for name, value in vars(rl).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(rl.__all__)


def test_names_fixed_by_the_architecture_are_exported():
    assert ARCHITECTURE_NAMES <= set(rl.__all__)


def test_errors_lists_every_error_class_and_the_package_keeps_the_common_ones():
    every = {cls.__name__ for cls in all_error_classes()} | {"JobFailure", "Snooze"}
    assert set(errors.__all__) == every
    assert errors.__all__ == sorted(errors.__all__)
    assert all(getattr(errors, name).__name__ == name for name in errors.__all__)
    exported = {name for name in rl.__all__ if isinstance(getattr(rl, name), type) and issubclass(getattr(rl, name), BaseException)}
    assert exported <= every
    # Only the common ones: the rare leaves are reached as rl.errors.<Name>.
    assert 15 <= len(exported) < len(every) // 2
    assert {"RunledgerError", "JobFailure", "JobCancelled", "InvalidPayload", "JobNotFound"} <= exported
