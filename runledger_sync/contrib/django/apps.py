"""The Django app: add ``"runledger_sync.contrib.django"`` to INSTALLED_APPS.

``ready()`` reads the ``RUNLEDGER`` setting (see :mod:`.settings`); the engine
is built from ``DATABASES`` on first use, and the registry is imported on first
use, so starting Django opens no connection and imports no job module.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

import runledger_sync as rl
from runledger_sync.contrib.django.settings import (
    RunledgerSettings,
    database_url,
    jobs_config,
    read_settings,
)

APP_LABEL = "runledger"


class RunledgerConfig(AppConfig):
    """Holds the queue's settings, engines and registry for this Django project."""

    name = "runledger_sync.contrib.django"
    label = APP_LABEL
    verbose_name = "Runledger"

    runledger_settings: RunledgerSettings

    def ready(self) -> None:
        self.runledger_settings = read_settings(settings)
        self._lock = threading.Lock()
        self._engines: dict[str, Any] = {}
        self._registry: rl.JobRegistry | None = None

    def database_alias(self, using: str | None = None) -> str:
        """Return ``using``, or the ``DATABASE`` alias of the setting."""
        return using or self.runledger_settings.database

    def get_engine(self, using: str | None = None) -> Any:
        """Return the queue's Engine for a ``DATABASES`` alias, building it on first use."""
        alias = self.database_alias(using)
        with self._lock:
            if alias not in self._engines:
                if alias not in settings.DATABASES:
                    raise ImproperlyConfigured(f"DATABASES has no {alias!r} entry for the Runledger queue")
                url = database_url(settings.DATABASES[alias])
                self._engines[alias] = rl.create_engine(
                    url, schema=self.runledger_settings.schema, pool_mode=self.runledger_settings.pool_mode
                )
            return self._engines[alias]

    def get_registry(self) -> rl.JobRegistry:
        """Return the JobRegistry named by ``RUNLEDGER["REGISTRY"]``, importing it on first use.

        Raises:
            ImproperlyConfigured: no REGISTRY is set, or it names no JobRegistry.
        """
        with self._lock:
            if self._registry is None:
                self._registry = _load_registry(self.runledger_settings.registry)
            return self._registry

    def get_observer(self) -> Any:
        """Return the observer named by ``RUNLEDGER["OBSERVER"]`` (importing it on first use), or None."""
        spec = self.runledger_settings.observer
        if not isinstance(spec, str):
            return spec
        module_name, attribute = spec.split(":")
        return getattr(importlib.import_module(module_name), attribute)

    def jobs_config(self) -> rl.JobsConfig:
        """Return the JobsConfig of ``RUNLEDGER["CONFIG"]`` over :meth:`JobsConfig.from_env`."""
        return jobs_config(self.runledger_settings.config)

    def dispose(self) -> None:
        """Close every engine's pooled connections (they are rebuilt on next use)."""
        with self._lock:
            engines, self._engines = self._engines, {}
        for engine in engines.values():
            engine.dispose()


def _load_registry(spec: str | None) -> rl.JobRegistry:
    if spec is None:
        raise ImproperlyConfigured('set RUNLEDGER = {"REGISTRY": "myapp.jobs:registry"} to run jobs')
    module_name, attribute = spec.split(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if callable(target) and not isinstance(target, rl.JobRegistry):
        target = target()
    if not isinstance(target, rl.JobRegistry):
        raise ImproperlyConfigured(f"RUNLEDGER['REGISTRY'] {spec!r} is not a JobRegistry, got {target!r}")
    return target
