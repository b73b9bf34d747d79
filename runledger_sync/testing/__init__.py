"""Test helpers for applications that use runledger-sync, on a real PostgreSQL.

Work jobs in the test's own process with :func:`drain` (every due job, and what
those enqueue) or :func:`run_job` (one job, now); check what code under test
enqueued with :func:`assert_enqueued`, :func:`refute_enqueued` and
:func:`enqueued_jobs`. The pytest plugin
:mod:`runledger_sync.testing.pytest_plugin` (loaded by installing the package)
gives each test a fresh migrated database: fixtures ``runledger_url`` and
``runledger_engine``.

Example:
    ``from runledger_sync import testing; testing.drain(engine, registry)``
"""

from runledger_sync.testing.assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from runledger_sync.testing.in_process import DrainedJob, DrainResult, drain, run_job

__all__ = [
    "DrainResult",
    "DrainedJob",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "refute_enqueued",
    "run_job",
]
