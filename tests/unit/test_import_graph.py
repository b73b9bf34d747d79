"""No import cycles among our modules, every name is imported from the module that defines it, and
no module reaches into another package's private modules.

Both checks read the source with ``ast`` (nothing is imported).

Cycles: an edge is a module-level import. Imports inside a function, and
imports under ``if TYPE_CHECKING:``, do not count: neither runs when the module
is loaded, so neither can leave a module half-initialised. A parent package's
``__init__`` running first is not counted either: ``runledger_sync/__init__``
imports the public API, so it would close a loop through every module. The
cycles that the deferred imports close are pinned apart, in DEFERRED_CYCLES.

Re-exports: a module that imports a name and lets others import it from there
gives the name two homes, and a split module that re-exports its parts keeps
its old importers pointed at the facade. So ``from runledger_sync.a import X``
(or ``a.X`` through ``from runledger_sync import a``) must name a module that
defines ``X`` (or a submodule ``a.X``), and a module's ``__all__`` lists only
names it defines. Packages (``runledger_sync``, ``runledger_sync.web``,
``runledger_sync.cli``) are public namespaces and are exempt, like the modules in
PUBLIC_NAMESPACES, and so are the public faces in PUBLIC_FACES for the names
they take from their own package.

Private modules: a module whose name (or a package on its path) starts with
``_`` belongs to its package. Only that package's modules import it; every other
module of ``runledger_sync``, and ``bench`` and ``examples``, go through the
public API or a public module. The runtime takes the store only through
``runledger_sync.store.driver``, the one list of what it asks of the database.
Tests may reach a private module to test it.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

import runledger_sync

PACKAGE = "runledger_sync"
PACKAGE_ROOT = Path(runledger_sync.__file__).parent
REPO_ROOT = PACKAGE_ROOT.parent
#: Where importers of our modules live, besides the package itself.
OTHER_IMPORTERS = ("tests", "bench", "examples", "alembic")

#: frozenset of modules in one cycle -> why it stays. A stale entry fails.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

#: Cycles closed only by an import inside a function or under TYPE_CHECKING: no
#: module is left half-initialised, but each is a place where two modules know
#: each other. The list is exact: a new one, or one that is gone, fails.
DEFERRED_CYCLES: dict[frozenset[str], str] = {}

#: Public module -> why it answers for names written in other modules of its own
#: package: those names may be imported from it, and its ``__all__`` may list them.
#: A face that takes no name from its package fails.
PUBLIC_FACES: dict[str, str] = {
    "runledger_sync.store.driver": "the runtime's one door into the store: every operation it needs, in one list",
}

#: Module -> why it is a public namespace like a package: it gathers names for users.
PUBLIC_NAMESPACES: dict[str, str] = {
    "runledger_sync.errors": "every error class in one import for users; each is defined in core",
}

#: Where modules that must not import another package's private modules live, besides the package.
PUBLIC_API_USERS = ("bench", "examples")
#: The one store module the runtime imports.
RUNTIME_STORE_DOOR = "runledger_sync.store.driver"

#: (importer, module, name) -> why ``name`` is reached through a module that does
#: not define it. A stale entry fails.
ALLOWED_REACH_THROUGH: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Source:
    name: str
    is_package: bool
    tree: ast.Module


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def package_sources() -> dict[str, Source]:
    found = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        name, is_package = module_name(path)
        found[name] = Source(name, is_package, ast.parse(path.read_text(encoding="utf-8")))
    return found


def base_of(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import run when the module loads: not in a function, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                visit(node.orelse if is_type_checking(node) else node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(tree.body)
    return found


def graph(sources: dict[str, Source], *, deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports when loaded (with ``deferred``: anywhere in it)."""
    edges: dict[str, set[str]] = {name: set() for name in sources}
    for source in sources.values():
        if deferred:
            nodes = [n for n in ast.walk(source.tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        else:
            nodes = module_level_imports(source.tree)
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = base_of(node, source.name, source.is_package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
            edges[source.name] |= {t for t in targets if t in sources and t != source.name}
    return edges


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def names_taken_from_own_package(source: Source) -> set[str]:
    """Names a module binds by importing them from another module of its own package (or of a package under it)."""
    package = source.name if source.is_package else source.name.rpartition(".")[0]
    names: set[str] = set()
    for node in module_level_imports(source.tree):
        if isinstance(node, ast.ImportFrom):
            base = base_of(node, source.name, source.is_package)
            if base.startswith(package + ".") and base != source.name:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def names_taken_from_us(source: Source) -> set[str]:
    """Names a module binds by importing them from another of our modules."""
    names: set[str] = set()
    for node in module_level_imports(source.tree):
        if isinstance(node, ast.ImportFrom) and base_of(node, source.name, source.is_package).startswith(PACKAGE):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds itself at top level (imports excluded)."""
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)

    visit(tree.body)
    return names


def reach_throughs(
    importer: str,
    tree: ast.Module,
    sources: dict[str, Source],
    borrowed: dict[str, set[str]],
    *,
    is_package: bool = False,
) -> set[tuple[str, str, str]]:
    """(importer, module, name) for each name taken from a module that itself imported it from us.

    ``borrowed`` maps each module to the names it imported from another of ours
    and does not define (:func:`borrowed_names`).
    """

    def foreign(module: str, name: str) -> bool:
        source = sources.get(module)
        return source is not None and not source.is_package and module not in PUBLIC_NAMESPACES and name in borrowed[module]

    found: set[tuple[str, str, str]] = set()
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = base_of(node, importer, is_package)
            for alias in node.names:
                if f"{base}.{alias.name}" in sources:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif foreign(base, alias.name):
                    found.add((importer, base, alias.name))
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in sources})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module = aliases[node.value.id]
            if foreign(module, node.attr):
                found.add((importer, module, node.attr))
    return found


def borrowed_names(sources: dict[str, Source]) -> dict[str, set[str]]:
    """Module -> the names it imported from another of ours, does not define, and is not the face of."""

    def answers_for(source: Source) -> set[str]:
        return names_taken_from_own_package(source) if source.name in PUBLIC_FACES else set()

    return {
        name: {
            n for n in names_taken_from_us(source) - defined_names(source.tree) - answers_for(source)
            if f"{name}.{n}" not in sources
        }
        for name, source in sources.items()
    }


def all_reach_throughs() -> set[tuple[str, str, str]]:
    sources = package_sources()
    borrowed = borrowed_names(sources)
    found = set()
    for source in sources.values():
        found |= reach_throughs(source.name, source.tree, sources, borrowed, is_package=source.is_package)
    for folder in OTHER_IMPORTERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            name, _ = module_name(path)
            found |= reach_throughs(name, ast.parse(path.read_text(encoding="utf-8")), sources, borrowed)
    return found


def foreign_all_entries(sources: dict[str, Source]) -> list[str]:
    found = []
    for source in sources.values():
        if source.is_package or source.name in PUBLIC_NAMESPACES:
            continue
        for node in source.tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                listed = {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
                own = defined_names(source.tree)
                if source.name in PUBLIC_FACES:
                    own |= names_taken_from_own_package(source)
                found += [f"{source.name}.__all__ lists {n}" for n in sorted(listed - own)]
    return found


def every_import_target(name: str, tree: ast.Module, sources: dict[str, Source], *, is_package: bool = False) -> set[str]:
    """The modules of ours that a module imports anywhere (in functions and under TYPE_CHECKING too)."""
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = base_of(node, name, is_package)
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names)
    return {t for t in targets if t == PACKAGE or t.startswith(PACKAGE + ".")}


def private_owner(module: str) -> str | None:
    """The package a private module belongs to (the one holding its first ``_`` part), or None if it is public."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:index])
    return None


def private_reaches(name: str, tree: ast.Module, sources: dict[str, Source], *, is_package: bool = False) -> set[tuple[str, str]]:
    """(importer, module) for each private module of another package that ``name`` imports."""
    found = set()
    for target in every_import_target(name, tree, sources, is_package=is_package):
        owner = private_owner(target)
        if owner is not None and name != owner and not name.startswith(owner + "."):
            found.add((name, target))
    return found


def all_private_reaches() -> set[tuple[str, str]]:
    sources = package_sources()
    found = set()
    for source in sources.values():
        found |= private_reaches(source.name, source.tree, sources, is_package=source.is_package)
    for folder in PUBLIC_API_USERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            name, _ = module_name(path)
            found |= private_reaches(name, ast.parse(path.read_text(encoding="utf-8")), sources)
    return found


# --- the real package -----------------------------------------------------------


def test_the_walk_sees_the_package_and_its_edges():
    edges = graph(package_sources())
    assert "runledger_sync.core.errors" in edges["runledger_sync.core.workflow_errors"]
    assert "runledger_sync.db.schema" in edges["runledger_sync.db.schema_workflows"]


def test_no_import_cycles():
    found = cycles(graph(package_sources()))
    unexpected = sorted(sorted(c) for c in found if c not in ALLOWED_CYCLES)
    assert unexpected == []


def test_allowed_cycles_still_exist():
    found = cycles(graph(package_sources()))
    assert [sorted(c) for c in ALLOWED_CYCLES if c not in found] == []


def test_the_cycles_closed_by_deferred_imports_are_the_known_ones():
    found = cycles(graph(package_sources(), deferred=True)) - cycles(graph(package_sources()))
    assert sorted(sorted(c) for c in found) == sorted(sorted(c) for c in DEFERRED_CYCLES)


def test_names_are_imported_from_the_module_that_defines_them():
    unexpected = sorted(r for r in all_reach_throughs() if r not in ALLOWED_REACH_THROUGH)
    assert unexpected == []


def test_allowed_reach_throughs_still_exist():
    found = all_reach_throughs()
    assert [r for r in ALLOWED_REACH_THROUGH if r not in found] == []


def test_a_module_all_lists_only_its_own_names():
    assert foreign_all_entries(package_sources()) == []


def test_every_public_face_answers_for_names_of_its_package():
    sources = package_sources()
    assert [face for face in PUBLIC_FACES if private_owner(face) is not None] == []
    assert [face for face in PUBLIC_FACES if not names_taken_from_own_package(sources[face])] == []


def test_no_module_imports_a_private_module_of_another_package():
    assert sorted(all_private_reaches()) == []


def test_the_runtime_takes_the_store_only_through_the_driver():
    sources = package_sources()
    found = {
        (source.name, target)
        for source in sources.values()
        if source.name.startswith(f"{PACKAGE}.runtime.")
        for target in every_import_target(source.name, source.tree, sources, is_package=source.is_package)
        if target.startswith(f"{PACKAGE}.store") and target != RUNTIME_STORE_DOOR
    }
    assert sorted(found) == []
    runtime_imports = set().union(*(
        every_import_target(s.name, s.tree, sources) for s in sources.values() if s.name.startswith(f"{PACKAGE}.runtime.")
    ))
    assert RUNTIME_STORE_DOOR in runtime_imports


#: Driver name -> why it is there though the runtime does not call it.
DRIVER_NAMES_FOR_TOOLS = {
    "claim_jobs": "bench/scale.py times the claim statement by hand",
}


def names_used_from(module: str, tree: ast.Module) -> set[str]:
    """Names a file takes from ``module``: imported by name, or read as ``alias.name``."""
    package, _, leaf = module.rpartition(".")
    used: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            aliases.update(alias.asname or alias.name for alias in node.names if alias.name == leaf)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            used.add(node.attr)
    return used


def test_every_name_of_the_driver_is_one_the_runtime_uses():
    sources = package_sources()
    driver = importlib.import_module(RUNTIME_STORE_DOOR)
    used = set().union(*(
        names_used_from(RUNTIME_STORE_DOOR, s.tree) for s in sources.values() if s.name.startswith(f"{PACKAGE}.runtime.")
    ))
    assert used - set(driver.__all__) == set()
    assert sorted(set(driver.__all__) - used) == sorted(DRIVER_NAMES_FOR_TOOLS)


def test_the_driver_takes_nothing_from_outside_the_store_but_the_core_types_it_speaks():
    # The seam lists the store's operations; it is not a door to the other layers. The
    # types its operations take and return come from core, and it passes none of them on.
    sources = package_sources()
    source = sources[RUNTIME_STORE_DOOR]
    targets = every_import_target(source.name, source.tree, sources)
    assert {t for t in targets if not t.startswith((f"{PACKAGE}.store.", f"{PACKAGE}.core."))} == set()
    from_core = {
        alias.asname or alias.name
        for node in module_level_imports(source.tree) if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(f"{PACKAGE}.core.")
        for alias in node.names
    }
    assert from_core & set(importlib.import_module(RUNTIME_STORE_DOOR).__all__) == set()


@pytest.mark.parametrize(
    ("facade", "name"),
    [
        ("runledger_sync.core.errors", "StoreError"),
        ("runledger_sync.core.errors", "WorkflowRunNotFound"),
        ("runledger_sync.core.errors", "DashboardRefusal"),
        ("runledger_sync.db.schema", "workflow_steps"),
        # The store's old faces, lifecycle, admin and workflows: their names are imported from their homes.
        ("runledger_sync.store.attempt.ends", "claim_prestart_jobs_for_types"),
        ("runledger_sync.store.attempt.ends", "heartbeat_job"),
        ("runledger_sync.store.attempt.ends", "reap_expired_leases"),
        ("runledger_sync.store.admin.jobs", "cancel_job"),
        ("runledger_sync.store.admin.jobs", "queue_stats"),
        ("runledger_sync.store.workflows.enqueue", "cancel_workflow_run"),
    ],
)
def test_a_removed_facade_does_not_come_back(facade, name):
    # Each of these modules once imported the name only to re-export it; its
    # home is the module that defines it, and importers go there.
    source = package_sources()[facade]
    imported = {a.asname or a.name for node in module_level_imports(source.tree) for a in node.names}
    assert name not in imported | defined_names(source.tree)


#: The store names the architecture fixes (spec section 4's names), by the module that
#: defines each: the store's modules are private, but its operations keep their names.
ARCHITECTURE_STORE_NAMES = {
    "runledger_sync.store.claim.claim": ("claim_prestart_jobs_for_types",),
    "runledger_sync.store.attempt.running": ("update_job_progress", "heartbeat_job"),
    "runledger_sync.store.attempt.ends": ("complete_job_success", "complete_job_failure", "release_unstarted_job_claim"),
    "runledger_sync.store.maintenance.reaper": ("reap_expired_leases",),
    "runledger_sync.store.enqueue.enqueue": ("enqueue", "enqueue_many"),
    "runledger_sync.store.definitions": ("upsert_job_definition",),
    "runledger_sync.store.admin.jobs": ("get_job", "list_jobs"),
    "runledger_sync.store.admin.actions": ("cancel_job", "requeue_job"),
    "runledger_sync.store.admin.stats": ("queue_stats",),
}


@pytest.mark.parametrize(("module", "names"), ARCHITECTURE_STORE_NAMES.items())
def test_the_store_names_the_architecture_fixes_are_still_defined(module, names):
    assert set(names) <= defined_names(package_sources()[module].tree)


# --- the checkers themselves, on made-up modules ---------------------------------


def made_up(**modules: str) -> dict[str, Source]:
    return {f"runledger_sync.{name}": Source(f"runledger_sync.{name}", False, ast.parse(text)) for name, text in modules.items()}


def test_a_module_level_circle_is_found():
    sources = made_up(
        a="from runledger_sync.b import x",
        b="import runledger_sync.c",
        c="from runledger_sync import a",
        d="from runledger_sync.a import y",
    )
    assert cycles(graph(sources)) == {frozenset({"runledger_sync.a", "runledger_sync.b", "runledger_sync.c"})}


@pytest.mark.parametrize(
    "back_edge",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runledger_sync.a import x",
        "import typing\nif typing.TYPE_CHECKING:\n    from runledger_sync.a import x",
        "def f():\n    from runledger_sync.a import x",
        "class C:\n    def m(self):\n        import runledger_sync.a",
    ],
)
def test_type_checking_and_function_imports_close_no_circle(back_edge):
    sources = made_up(a="from runledger_sync.b import y", b=back_edge)
    assert cycles(graph(sources)) == set()
    assert cycles(graph(sources, deferred=True)) == {frozenset({"runledger_sync.a", "runledger_sync.b"})}


def test_a_module_level_import_in_an_else_or_try_closes_a_circle():
    sources = made_up(
        a="from runledger_sync.b import y",
        b="try:\n    from runledger_sync.a import x\nexcept ImportError:\n    pass",
    )
    assert cycles(graph(sources)) == {frozenset({"runledger_sync.a", "runledger_sync.b"})}


def test_a_private_module_is_reached_only_from_inside_its_package():
    sources = {
        f"runledger_sync.{name}": Source(f"runledger_sync.{name}", False, ast.parse(""))
        for name in ("store._claim", "store.driver", "runtime.worker.loop", "_bundled.versions", "cli.__main__")
    }

    def check(importer: str, text: str) -> set[tuple[str, str]]:
        return private_reaches(importer, ast.parse(text), sources)

    worker = "runledger_sync.runtime.worker.loop"
    assert check(worker, "from runledger_sync.store._claim import claim") == {(worker, "runledger_sync.store._claim")}
    assert check(worker, "from runledger_sync.store import _claim") == {(worker, "runledger_sync.store._claim")}
    assert check(worker, "def f():\n    import runledger_sync.store._claim") == {(worker, "runledger_sync.store._claim")}
    assert check(worker, "from runledger_sync.store.driver import claim\nimport runledger_sync.cli.__main__") == set()
    assert check("runledger_sync.store.driver", "from runledger_sync.store._claim import claim") == set()
    assert check("runledger_sync.db.host", "import runledger_sync._bundled.versions") == set()
    assert check("bench.scale", "from runledger_sync._bundled import versions") == {
        ("bench.scale", "runledger_sync._bundled.versions"),
    }


def test_a_re_export_is_flagged_and_a_definition_is_not():
    sources = made_up(
        home="def f(): ...\nCONSTANT = 1",
        facade="import os\nfrom runledger_sync.home import f\n__all__ = ['f']",
    )
    borrowed = borrowed_names(sources)

    def check(text: str) -> set[tuple[str, str, str]]:
        return reach_throughs("tests.t", ast.parse(text), sources, borrowed)

    assert check("from runledger_sync.facade import f") == {("tests.t", "runledger_sync.facade", "f")}
    assert check("from runledger_sync import facade\nfacade.f()") == {("tests.t", "runledger_sync.facade", "f")}
    assert check("import runledger_sync.facade as fc\nfc.f()") == {("tests.t", "runledger_sync.facade", "f")}
    assert check("from runledger_sync.home import CONSTANT, f") == set()
    # A module's own imports of other libraries are not our names; tests patch them there.
    assert check("from runledger_sync import facade\nfacade.os.getpid()") == set()
    assert foreign_all_entries(sources) == ["runledger_sync.facade.__all__ lists f"]
