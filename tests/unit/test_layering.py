"""Imports only point down the layers: core < config, registry < db < store < runtime < cli, contrib, web, testing.

The walk reads every module under ``runledger_sync`` with ``ast`` (nothing is
imported), including imports inside functions, so a lazy import of a higher
layer needs an entry in ALLOWED_UPWARD_IMPORTS with its reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import runledger_sync

PACKAGE = "runledger_sync"
PACKAGE_ROOT = Path(runledger_sync.__file__).parent

#: Top-level module or subpackage -> layer; a higher number may import a lower one.
LAYERS: dict[str, int] = {
    "core": 0,
    "config": 1,
    "config_env": 1,
    "config_checks": 1,
    "registry": 1,
    "handlers": 1,
    # The registry's middleware chain, enqueue and failure hooks, and its declared
    # queues and schedules (the registry's bases); they import core and handlers only.
    "middleware": 1,
    "declarations": 1,
    # Names a registry in text for the CLI and worker processes; imports the registry.
    "loading": 1,
    # logging imports only the standard library and python-json-logger, and every
    # layer above core logs, so it sits with config.
    "logging": 1,
    # Every error class gathered from core for users (rl.errors); imports core only.
    "errors": 1,
    "db": 2,
    "store": 3,
    "runtime": 4,
    # Beside runtime: it reads the store and implements the runtime's observer
    # interface, which the runtime reaches only through that interface.
    "metrics": 4,
    "cli": 5,
    "contrib": 5,
    "web": 5,
    "testing": 5,
    "aio": 5,
    "demo": 5,
    "__main__": 5,
}
#: The package's own ``__init__`` re-exports the public API, so it is the top layer;
#: only cli, contrib and testing may import ``runledger_sync`` itself.
ROOT_LAYER = 5

#: (importer, imported module) -> why the upward edge is acceptable. Each must be
#: an import inside a function, never at module level.
ALLOWED_UPWARD_IMPORTS: dict[tuple[str, str], str] = {
    # JobRegistry.sync_definitions() is a convenience for users; it writes the
    # definitions through the store, which sits above the registry. Importing it
    # inside the method keeps `import runledger_sync.registry` free of the store.
    (
        "runledger_sync.registry",
        "runledger_sync.store.enqueue.enqueue",
    ): "registry.enqueue (which checks a typed payload first) delegates to the store",
    (
        "runledger_sync.registry",
        "runledger_sync.store.definitions",
    ): "registry.sync_definitions writes the job definitions through the store",
    (
        "runledger_sync.registry",
        "runledger_sync.store.schedules",
    ): "registry.sync_definitions writes the declared schedules through the store",
    (
        "runledger_sync.registry",
        "runledger_sync.store.queues",
    ): "registry.sync_definitions writes the declared queues through the store",
    (
        "runledger_sync.registry",
        "runledger_sync.store.workflows.enqueue",
    ): "registry.enqueue_workflow (which checks typed step payloads first) delegates to the store",
}

IO_LIBRARIES = {"sqlalchemy", "psycopg2", "psycopg", "alembic", "tenacity", "pythonjsonlogger", "pgserver"}


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str
    line: int
    lazy: bool
    relative: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """Return the layer of one of our modules, or None if no layer claims it."""
    parts = module.split(".")
    if parts == [PACKAGE]:
        return ROOT_LAYER
    return LAYERS.get(parts[1]) if parts[0] == PACKAGE else None


def imports_of(importer: str, source: str, *, is_package: bool = False) -> list[Edge]:
    """Return every import of a ``runledger_sync`` module in ``source``, lazy ones marked."""
    tree = ast.parse(source)
    edges: list[Edge] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    edges.append(Edge(importer, alias.name, child.lineno, inner, False))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = importer.split(".") if is_package else importer.split(".")[:-1]
                    package = package[: len(package) - (child.level - 1)]
                    base = ".".join(package + ([base] if base else []))
                for alias in child.names:
                    edges.append(
                        Edge(importer, resolve(base, alias.name), child.lineno, inner, bool(child.level))
                    )
            visit(child, inner)

    visit(tree, False)
    return [e for e in edges if e.target == PACKAGE or e.target.startswith(PACKAGE + ".")]


def resolve(base: str, name: str) -> str:
    # `from runledger_sync import store` names a subpackage; `from runledger_sync
    # import JobsConfig` names the package facade. Deeper down, the submodule is in
    # the same layer as its package, so `base` alone decides.
    if base == PACKAGE and name in LAYERS:
        return f"{PACKAGE}.{name}"
    return base


def violations(edges: list[Edge]) -> list[str]:
    found = []
    for edge in edges:
        low, high = layer_of(edge.importer), layer_of(edge.target)
        if low is None or high is None or high <= low:
            continue
        allowed = (edge.importer, edge.target) in ALLOWED_UPWARD_IMPORTS
        if allowed and edge.lazy:
            continue
        why = "allowlisted only as a lazy import" if allowed else f"layer {low} imports layer {high}"
        found.append(f"{edge.importer}:{edge.line} imports {edge.target} ({why})")
    return found


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def all_edges() -> list[Edge]:
    edges = []
    for name, path in all_modules().items():
        edges.extend(
            imports_of(name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py")
        )
    return edges


# --- the real package -----------------------------------------------------------


def test_walk_finds_the_package_modules():
    modules = all_modules()
    assert {
        "runledger_sync",
        "runledger_sync.core.errors",
        "runledger_sync.config",
        "runledger_sync.registry",
    } <= set(modules)


def test_every_module_has_a_layer():
    assert [name for name in all_modules() if layer_of(name) is None] == []


def test_no_module_imports_a_higher_layer():
    assert violations(all_edges()) == []


def test_core_imports_nothing_of_ours_outside_core():
    outside = [
        f"{e.importer}:{e.line} imports {e.target}"
        for e in all_edges()
        if e.importer.startswith(f"{PACKAGE}.core") and not e.target.startswith(f"{PACKAGE}.core")
    ]
    assert outside == []


def test_core_does_no_io():
    found = []
    for name, path in all_modules().items():
        if not name.startswith(f"{PACKAGE}.core"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            found += [f"{name}:{node.lineno} imports {top}" for top in tops if top in IO_LIBRARIES]
    assert found == []


def test_runtime_never_imports_metrics():
    # The worker holds an observer or None; importing the implementation would tie
    # the hot path to prometheus_client.
    found = [f"{e.importer}:{e.line}" for e in all_edges()
             if e.importer.startswith(f"{PACKAGE}.runtime") and e.target.startswith(f"{PACKAGE}.metrics")]
    assert found == []


def test_imports_are_absolute():
    assert [f"{e.importer}:{e.line}" for e in all_edges() if e.relative] == []


def test_allowlisted_upward_imports_exist_and_are_lazy():
    # A stale entry would silently permit a future module-level import.
    edges = all_edges()
    for importer, target in ALLOWED_UPWARD_IMPORTS:
        matching = [e for e in edges if (e.importer, e.target) == (importer, target)]
        assert matching, f"{importer} no longer imports {target}; drop the allowlist entry"
        assert all(e.lazy for e in matching), f"{importer} imports {target} at module level"


# --- the checker itself, on made-up modules ---------------------------------------


@pytest.mark.parametrize(
    ("importer", "source", "expected"),
    [
        (
            "runledger_sync.store.attempt.ends",
            "from runledger_sync.runtime.worker.loop import x",
            ["layer 3 imports layer 4"],
        ),
        ("runledger_sync.core.types", "import runledger_sync.config", ["layer 0 imports layer 1"]),
        ("runledger_sync.core.types", "from runledger_sync import logging", ["layer 0 imports layer 1"]),
        (
            "runledger_sync.runtime.worker.loop",
            "from runledger_sync import JobsConfig",
            ["layer 4 imports layer 5"],
        ),
        (
            "runledger_sync.db.engine",
            "def f():\n    from runledger_sync.store import admin",
            ["layer 2 imports layer 3"],
        ),
        (
            "runledger_sync.registry",
            "from runledger_sync.store.definitions import sync_job_definitions",
            ["allowlisted only as a lazy import"],
        ),
        (
            "runledger_sync.registry",
            "def f():\n    from runledger_sync.store.definitions import sync_job_definitions",
            [],
        ),
        (
            "runledger_sync.registry",
            "def f():\n    from runledger_sync.store.admin.jobs import get_job",
            ["layer 1 imports layer 3"],
        ),
        (
            "runledger_sync.runtime.worker.loop",
            "from runledger_sync.store import lifecycle\nfrom runledger_sync.core import backoff",
            [],
        ),
        ("runledger_sync.cli", "import runledger_sync\nfrom runledger_sync import Supervisor", []),
        ("runledger_sync.config", "from runledger_sync import registry, logging", []),
        (
            "runledger_sync.store.admin.jobs",
            "from .. import rows\nfrom ...runtime import worker",
            ["layer 3 imports layer 4"],
        ),
        ("runledger_sync.store.admin.jobs", "import sqlalchemy\nimport logging", []),
    ],
)
def test_checker_flags_only_upward_edges(importer, source, expected):
    found = violations(imports_of(importer, source))
    assert len(found) == len(expected)
    for message, fragment in zip(found, expected, strict=True):
        assert fragment in message


def test_relative_imports_are_resolved_and_marked():
    edges = imports_of(
        "runledger_sync.store", "from .claim.claim import claim_jobs\nfrom .. import config", is_package=True
    )
    assert [(e.target, e.relative) for e in edges] == [
        ("runledger_sync.store.claim.claim", True),
        ("runledger_sync.config", True),
    ]


def test_layer_map():
    assert layer_of("runledger_sync") == ROOT_LAYER
    assert (
        layer_of("runledger_sync.core.backoff")
        < layer_of("runledger_sync.config")
        == layer_of("runledger_sync.registry")
    )
    assert (
        layer_of("runledger_sync.registry")
        < layer_of("runledger_sync.db.schema")
        < layer_of("runledger_sync.store.admin.jobs")
    )
    assert (
        layer_of("runledger_sync.store.admin.jobs")
        < layer_of("runledger_sync.runtime.worker.loop")
        < layer_of("runledger_sync.cli")
    )
    assert layer_of("runledger_sync.contrib.flask") == layer_of("runledger_sync.testing") == ROOT_LAYER
    assert layer_of("runledger_sync.unknown_module") is None
    assert layer_of("sqlalchemy.engine") is None
