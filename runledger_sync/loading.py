"""Name a registry in text (``module:attribute``), as the CLI's ``--app`` and worker processes do."""

from __future__ import annotations

import importlib
from typing import Any

from runledger_sync.core.errors import ConfigError
from runledger_sync.registry import JobRegistry


def load_registry(spec: str, *, option: str = "app") -> JobRegistry:
    """Import ``module:attribute`` and return the JobRegistry it names (calling it if it is a factory).

    The one way a registry is named outside the code that builds it: the CLI's
    ``--app`` and ``Supervisor(processes=N, app=...)``, whose worker processes
    import it again.

    Args:
        option: how the spec was given, for the messages (``--app`` on the command line).

    Raises:
        ConfigError: the spec is malformed, does not import, or names no JobRegistry.
    """
    module_name, _, attribute = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not module_name or not attribute:
        raise ConfigError([f"{option} must look like 'module:attribute', got {spec!r}"])
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError([f"{option} module {module_name!r} could not be imported: {exc}"]) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError([f"{option} {spec!r}: {module_name!r} has no attribute {attribute!r}"])
        target = getattr(target, part)
    if callable(target) and not isinstance(target, JobRegistry):
        target = target()
    if not isinstance(target, JobRegistry):
        raise ConfigError([f"{option} {spec!r} must name a JobRegistry, got {type(target).__name__}"])
    return target
