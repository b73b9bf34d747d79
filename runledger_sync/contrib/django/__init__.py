"""Django integration: enqueue in Django's transactions, run the worker as a management command.

Setup::

    INSTALLED_APPS = [..., "runledger_sync.contrib.django"]
    RUNLEDGER = {"REGISTRY": "myapp.jobs:registry"}

then ``manage.py runledger_migrate`` once and ``manage.py runledger_worker`` in
a worker process. In a view::

    from django.db import transaction
    from runledger_sync.contrib import django as runledger

    with transaction.atomic():
        order = Order.objects.create(...)
        runledger.enqueue("orders.confirm", {"order_id": order.pk})   # only if the block commits

Handlers run by ``runledger_worker`` may use the ORM: stale Django connections
are closed before and after each job, as Django does around each request.

This package imports only the public ``runledger_sync`` API.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from django.apps import apps as django_apps
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections, transaction

import runledger_sync as rl


def _app_config() -> Any:
    # Not named `apps`: importing the .apps submodule would rebind that package attribute.
    try:
        return django_apps.get_app_config("runledger")
    except LookupError:
        problem = rl.ConfigError(['the Runledger app is not installed: add "runledger_sync.contrib.django" '
                                  "to INSTALLED_APPS in your settings"])
        raise ImproperlyConfigured(str(problem)) from None


def get_engine(using: str | None = None) -> Any:
    """Return the queue's SQLAlchemy Engine, built from ``DATABASES`` on first use."""
    return _app_config().get_engine(using)


def get_registry() -> rl.JobRegistry:
    """Return the JobRegistry named by ``RUNLEDGER["REGISTRY"]``."""
    return _app_config().get_registry()


def get_config() -> rl.JobsConfig:
    """Return the worker's JobsConfig (``RUNLEDGER["CONFIG"]`` over the environment)."""
    return _app_config().jobs_config()


def enqueue(job_type: str, payload: Any = None, *, using: str | None = None, **options: Any) -> rl.JobRecord:
    """Enqueue a job through Django's own database connection (psycopg2 or psycopg 3, as Django picked).

    The job joins the current ``transaction.atomic()`` block, so it exists only
    if that block commits. Outside a block it is committed at once (the enqueue
    runs in its own atomic block). The queue schema is the connection's search
    path; set ``OPTIONS: {"options": "-c search_path=jobs,public"}`` when the
    tables live elsewhere.

    Args:
        job_type: A type with a job definition (``runledger_migrate`` writes them).
        payload: Any JSON value.
        using: The ``DATABASES`` alias; defaults to ``RUNLEDGER["DATABASE"]``.
        **options: As for :func:`runledger_sync.enqueue`.

    Returns:
        The job's record.
    """
    alias = _app_config().database_alias(using)
    connection = connections[alias]
    config = get_config()
    options.setdefault("max_payload_bytes", config.max_payload_bytes)
    options.setdefault("event_log", config.event_log)
    # A savepoint inside the caller's block: a refused enqueue undoes only itself.
    with transaction.atomic(using=alias):
        connection.ensure_connection()
        return rl.enqueue(connection.connection, job_type, payload, **options)


@contextlib.contextmanager
def _fresh_connections() -> Iterator[None]:
    # What Django does around each request: drop connections that are broken
    # or past CONN_MAX_AGE, so a long-lived worker never reuses a dead one.
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


def with_django_connections(registry: rl.JobRegistry) -> rl.JobRegistry:
    """Return a new registry whose handlers close stale Django connections around each call.

    The types, retry rules and definitions are those of ``registry``, which is unchanged.
    """
    return registry.wrapped(_fresh_connections)


def get_observer() -> Any:
    """Return the worker's observer named by ``RUNLEDGER["OBSERVER"]``, or None."""
    return _app_config().get_observer()


def build_supervisor(
    config: rl.JobsConfig | None = None, *, using: str | None = None, observer: Any = None,
) -> rl.Supervisor:
    """Return a Supervisor over the project's engine and wrapped registry (definitions written).

    Args:
        config: Defaults to :func:`get_config`.
        using: The ``DATABASES`` alias; defaults to ``RUNLEDGER["DATABASE"]``.
        observer: What the worker reports to; defaults to :func:`get_observer`.
    """
    engine = get_engine(using)
    registry = with_django_connections(get_registry())
    registry.sync_definitions(engine)
    return rl.Supervisor(engine, registry, config if config is not None else get_config(),
                         observer=observer if observer is not None else get_observer())


def migrate(using: str | None = None) -> tuple[str | None, str | None]:
    """Upgrade the queue schema to head and, if a REGISTRY is set, write its definitions.

    Returns:
        The (before, after) schema revisions.
    """
    engine = get_engine(using)
    before = rl.current_revision(engine)
    rl.migrate(engine)
    after = rl.current_revision(engine)
    if _app_config().runledger_settings.registry is not None:
        get_registry().sync_definitions(engine)
    return before, after


__all__ = [
    "build_supervisor",
    "enqueue",
    "get_config",
    "get_engine",
    "get_observer",
    "get_registry",
    "migrate",
    "with_django_connections",
]
