"""Translate Django settings into what the queue needs: a database URL, a schema, a JobsConfig.

All of it is read from ``django.conf.settings`` by ``RunledgerConfig.ready()``,
never at import::

    RUNLEDGER = {
        "REGISTRY": "myapp.jobs:registry",   # module:attribute (a callable returning one works too)
        "SCHEMA": "jobs",                    # optional; else RUNLEDGER_SCHEMA, else the search path
        "DATABASE": "default",               # optional; the DATABASES alias holding the queue
        "POOL_MODE": "transaction",          # optional; behind PgBouncer in transaction pooling mode
        "CONFIG": {"max_global_concurrency": 8},   # JobsConfig fields over JobsConfig.from_env()
        "OBSERVER": "myapp.ops:worker_metrics",   # optional; what the worker reports to (module:attribute or the object)
        "DASHBOARD": {                       # optional; the dashboard mounted by contrib.django.urls
            "READ_ONLY": False,              # default True
            "AUTHORIZE": "myapp.ops:can",    # authorize(django_request, action); default: staff users only
            "ORGANIZATION": None,            # an organization id, or a callable of the request
        },
    }
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from sqlalchemy.engine import URL

import runledger_sync as rl

SETTING_NAME = "RUNLEDGER"
DEFAULT_DATABASE_ALIAS = "default"
KNOWN_KEYS = frozenset({"REGISTRY", "SCHEMA", "DATABASE", "CONFIG", "POOL_MODE", "DASHBOARD", "OBSERVER"})
DASHBOARD_KEYS = frozenset({"READ_ONLY", "AUTHORIZE", "ORGANIZATION"})
#: DATABASES ENGINE values that speak PostgreSQL.
POSTGRES_ENGINES = frozenset(
    {"django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2", "django.contrib.gis.db.backends.postgis"}
)
#: OPTIONS keys that configure Django's backend or psycopg 3 (prepare_threshold),
#: not libpq; left out of the URL of the queue's psycopg2 engine.
DJANGO_ONLY_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory", "prepare_threshold"}
)


@dataclass(frozen=True)
class DashboardSettings:
    """The ``DASHBOARD`` part of the setting: the options of :func:`runledger_sync.web.create_app`.

    Attributes:
        read_only: Refuse every action.
        authorize: ``module:attribute`` of the hook, or the hook itself; None: staff users only.
        organization: An organization id, or a callable ``(request) -> id or None``.
    """

    read_only: bool = True
    authorize: Any = None
    organization: Any = None


@dataclass(frozen=True)
class RunledgerSettings:
    """The ``RUNLEDGER`` setting, checked.

    Attributes:
        registry: ``module:attribute`` of the JobRegistry, or None.
        schema: The schema holding the queue tables, or None.
        database: The ``DATABASES`` alias the queue lives in.
        config: JobsConfig field -> value, applied over :meth:`JobsConfig.from_env`.
        pool_mode: How the queue engine's connections reach PostgreSQL; None means
            the RUNLEDGER_POOL_MODE environment variable, then session.
        observer: ``module:attribute`` of the worker's observer (a
            :class:`runledger_sync.metrics.WorkerMetrics`, say), the observer itself, or None.
    """

    registry: str | None = None
    schema: str | None = None
    database: str = DEFAULT_DATABASE_ALIAS
    config: Mapping[str, Any] = field(default_factory=dict)
    pool_mode: rl.PoolMode | None = None
    dashboard: DashboardSettings = field(default_factory=DashboardSettings)
    observer: Any = None


def read_settings(django_settings: Any) -> RunledgerSettings:
    """Return the checked ``RUNLEDGER`` setting (all defaults when it is absent).

    Raises:
        ImproperlyConfigured: unknown keys, a malformed REGISTRY, unknown CONFIG fields
            or a POOL_MODE other than "session" and "transaction".
    """
    raw = getattr(django_settings, SETTING_NAME, None) or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{SETTING_NAME} must be a dict, got {raw!r}")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise ImproperlyConfigured(f"{SETTING_NAME} has unknown keys {unknown}; allowed: {sorted(KNOWN_KEYS)}")
    registry = raw.get("REGISTRY") or None
    if registry is not None and (not isinstance(registry, str) or registry.count(":") != 1):
        raise ImproperlyConfigured(f"{SETTING_NAME}['REGISTRY'] must look like 'module:registry', got {registry!r}")
    config = {str(key).lower(): value for key, value in (raw.get("CONFIG") or {}).items()}
    fields = {config_field.name for config_field in dataclasses.fields(rl.JobsConfig)}
    bad = sorted(set(config) - fields)
    if bad:
        raise ImproperlyConfigured(f"{SETTING_NAME}['CONFIG'] has unknown JobsConfig fields {bad}")
    return RunledgerSettings(
        registry=registry,
        schema=raw.get("SCHEMA") or None,
        database=raw.get("DATABASE") or DEFAULT_DATABASE_ALIAS,
        config=config,
        pool_mode=_pool_mode(raw.get("POOL_MODE")),
        dashboard=_dashboard(raw.get("DASHBOARD")),
        observer=_observer(raw.get("OBSERVER")),
    )


def _observer(value: Any) -> Any:
    if value is None:
        return None
    if (isinstance(value, str) and value.count(":") == 1) or callable(getattr(value, "job_finished", None)):
        return value
    raise ImproperlyConfigured(f"{SETTING_NAME}['OBSERVER'] must be 'module:attribute' or an observer "
                               f"(runledger_sync.metrics.WorkerMetrics, say), got {value!r}")


def _dashboard(value: Any) -> DashboardSettings:
    if value is None:
        return DashboardSettings()
    if not isinstance(value, Mapping) or set(value) - DASHBOARD_KEYS:
        raise ImproperlyConfigured(
            f"{SETTING_NAME}['DASHBOARD'] must be a dict with keys among {sorted(DASHBOARD_KEYS)}, got {value!r}"
        )
    read_only = value.get("READ_ONLY", True)
    if not isinstance(read_only, bool):
        raise ImproperlyConfigured(f"{SETTING_NAME}['DASHBOARD']['READ_ONLY'] must be True or False, got {read_only!r}")
    return DashboardSettings(read_only=read_only, authorize=value.get("AUTHORIZE"),
                             organization=value.get("ORGANIZATION"))


def _pool_mode(value: Any) -> rl.PoolMode | None:
    if value is None or value == "":
        return None
    try:
        return rl.PoolMode(value.strip().lower() if isinstance(value, str) else value)
    except ValueError:
        allowed = ", ".join(repr(mode.value) for mode in rl.PoolMode)
        raise ImproperlyConfigured(f"{SETTING_NAME}['POOL_MODE'] must be one of {allowed}, got {value!r}") from None


def jobs_config(overrides: Mapping[str, Any]) -> rl.JobsConfig:
    """Return :meth:`JobsConfig.from_env` with ``overrides`` applied (validated when the worker starts)."""
    return rl.JobsConfig.from_env().with_overrides(**overrides)


def database_url(settings_dict: Mapping[str, Any]) -> URL:
    """Build a psycopg2 SQLAlchemy URL from one ``DATABASES`` entry.

    A HOST starting with ``/`` is a Unix socket directory; it goes into the query
    string, where libpq reads it, and so does a list of servers (HOST ``"h1,h2"``,
    PORT ``"5432,5433"``; with OPTIONS ``{"target_session_attrs": "read-write"}``
    libpq keeps the writable one). String and number OPTIONS (``sslmode``...) are
    passed to libpq too.

    Raises:
        ImproperlyConfigured: the ENGINE is not PostgreSQL or NAME is missing.
    """
    engine = settings_dict.get("ENGINE", "")
    if engine not in POSTGRES_ENGINES:
        raise ImproperlyConfigured(f"the Runledger queue needs a PostgreSQL database, got ENGINE {engine!r}")
    name = settings_dict.get("NAME")
    if not name:
        raise ImproperlyConfigured("the Runledger queue's database needs a NAME")
    host = settings_dict.get("HOST") or None
    port = settings_dict.get("PORT") or None
    query: dict[str, str] = {
        str(key): str(value)
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key not in DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)) and not isinstance(value, bool)
    }
    if host is not None and host.startswith("/"):
        query["host"] = host
        host = None
    if "," in str(host or "") or "," in str(port or ""):
        # Several servers (HOST "h1,h2", PORT "5432,5433"), as Django's own backend hands
        # them to libpq: libpq's query form keeps the lists whole.
        query.update({"host": str(host or "")} | ({"port": str(port)} if port is not None else {}))
        host = port = None
    return URL.create(
        "postgresql+psycopg2",
        username=settings_dict.get("USER") or None,
        password=settings_dict.get("PASSWORD") or None,
        host=host,
        port=int(port) if port is not None else None,
        database=name,
        query=query,
    )
