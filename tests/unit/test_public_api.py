"""The public namespace is exactly ``__all__``, kept sorted (users import from it)."""

import types

import runledger_sync as rl

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
