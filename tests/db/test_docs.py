"""Every code block of the documentation (README.md and docs/**/*.md) is run or checked by a test.

A fenced block is either marked ``<!-- docs-test: NAME -->`` on the line before it, and
some test under tests/ names NAME and runs it (the first-job, Flask, Django, workflow,
grants and metrics blocks: tests/db/test_readme.py, test_examples_web.py, ...), or it is
one of the kinds run here without a marker:

- ``python``: each page's unmarked python blocks run in order, as one script, against a
  fresh migrated database (its URL in place of ``postgresql://app@localhost/app`` and in
  ``RUNLEDGER_DATABASE_URL``), in an empty working directory; and each page's first one
  runs alone on a database with no schema at all, as a reader who starts on that page would;
- ``sql``: run against a fresh migrated database, in a transaction rolled back;
- ``sh``: every line is a ``runledger-sync`` command (parsed by the real argument parser,
  and run against a fresh migrated database when it only reads), a ``pip install`` of this
  project with extras that exist, or an ``export``;
- ``ini``, ``toml``, ``json``, ``yaml``: parsed.

A block with neither a marker nor one of these kinds fails test_every_block_is_run_or_names_its_test.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import runledger_sync as rl
from runledger_sync import cli
from runledger_sync.cli._core import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PLACEHOLDER_URL = "postgresql://app@localhost/app"
MARKER = re.compile(r"^\s*<!-- docs-test: ([\w-]+) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
AUTO_KINDS = {"python", "sql", "sh", "ini", "toml", "json", "yaml"}
#: Commands run for real by the shell-block test: they only read, and need no object to exist.
READ_ONLY_COMMANDS = {("migrate",), ("check-schema",), ("stats",), ("jobs", "list"), ("dead-letters", "list"),
                      ("schedules", "list"), ("workflows", "list"), ("health",)}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    kind: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    return [README, *sorted(path for path in DOCS.rglob("*.md") if "_hooks" not in path.parts)]


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of one page, with the marker on the line before each (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, kind = opening.groups()
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        assert end is not None, f"{page}:{index + 1}: a code block is never closed"
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                         for line in lines[index + 1:end]) + "\n"
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(before)
        found.append(Block(page, index + 1, kind, code, marker.group(1) if marker else None))
        index = end + 1
    return found


def indented_code(page: Path) -> list[int]:
    """Line numbers of indented (unfenced) code blocks: four spaces after a blank line that follows
    a paragraph at the margin. They would escape the fenced-block checks, so none is allowed."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, fenced = [], False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line) or line.strip() == "```":
            fenced = not fenced
            continue
        if fenced or not line.startswith("    ") or number < 3 or lines[number - 2].strip():
            continue
        previous = next((lines[i] for i in range(number - 3, -1, -1) if lines[i].strip()), "")
        if previous and not previous[0].isspace() and not re.match(r"([-*+]|\d+\.) |\||<!--", previous):
            found.append(number)
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in page_blocks(page)]


def marked(name: str, kind: str | None = None) -> str:
    """The code of the one block marked ``docs-test: name`` anywhere in the documentation."""
    matches = [block for block in all_blocks() if block.marker == name and kind in (None, block.kind)]
    assert len(matches) == 1, f"expected one {kind or ''} block marked docs-test: {name}, found {len(matches)}"
    return matches[0].code


def page_text(relative: str) -> str:
    """A documentation page's text: ``README.md`` or a path under docs/."""
    return (REPO / relative if relative == "README.md" else DOCS / relative).read_text(encoding="utf-8")


# -- every block is accounted for ------------------------------------------------------------


def test_the_walk_finds_the_blocks():
    # Guards the walk: the tests below would pass vacuously if it found nothing.
    blocks = all_blocks()
    assert len(blocks) > 30
    assert {"python", "sh", "sql", "yaml"} <= {block.kind for block in blocks}
    assert sum(1 for block in blocks if block.marker) > 15


def test_every_block_is_run_or_names_its_test():
    test_sources = "\n".join(path.read_text(encoding="utf-8") for path in (REPO / "tests").rglob("*.py"))
    problems = []
    markers = [block.marker for block in all_blocks() if block.marker]
    problems += [f"docs-test: {name} marks more than one block" for name in set(markers) if markers.count(name) > 1]
    for block in all_blocks():
        if block.marker:
            if f'"{block.marker}"' not in test_sources:
                problems.append(f"{block.where}: docs-test: {block.marker} is named by no test under tests/")
        elif block.kind not in AUTO_KINDS:
            problems.append(f"{block.where}: a {block.kind or 'plain'} block needs a docs-test marker "
                            f"naming the test that checks it")
        elif block.kind == "sh":
            problems += [f"{block.where}: {line!r} is not run by this test: mark the block with docs-test"
                         for line in shell_lines(block.code) if line.split()[0] not in ("runledger-sync", "pip", "export")]
    problems += [f"{page.relative_to(REPO)}:{number}: an indented code block: fence it, so that it is checked"
                 for page in pages() for number in indented_code(page)]
    assert problems == []


# -- python ----------------------------------------------------------------------------------


def pages_with_python() -> list[Path]:
    return [page for page in pages() if any(b.kind == "python" and not b.marker for b in page_blocks(page))]


@pytest.mark.parametrize("page", pages_with_python(), ids=lambda page: str(page.relative_to(REPO)))
def test_the_unmarked_python_blocks_of_the_page_run(page, fresh_database, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", fresh_database)
    namespace: dict = {"__name__": "__docs__"}
    try:
        for block in page_blocks(page):
            if block.kind == "python" and not block.marker:
                code = block.code.replace(f'"{PLACEHOLDER_URL}"', repr(fresh_database))
                # dont_inherit: the blocks run as a user's script would, without this module's
                # `from __future__ import annotations` (a pydantic model's fields need theirs evaluated).
                exec(compile(code, block.where, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own documentation
    finally:
        engine = namespace.get("engine")
        if isinstance(engine, sa.Engine):
            engine.dispose()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("page", pages_with_python(), ids=lambda page: str(page.relative_to(REPO)))
def test_the_first_python_block_of_the_page_runs_alone_on_a_fresh_database(page, empty_database, tmp_path,
                                                                            monkeypatch, capsys):
    # A reader may open any page first and paste its first block: it creates what it uses,
    # the schema included, and assumes nothing an earlier page did.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNLEDGER_DATABASE_URL", empty_database)
    first = next(block for block in page_blocks(page) if block.kind == "python" and not block.marker)
    namespace: dict = {"__name__": "__docs__"}
    try:
        code = first.code.replace(f'"{PLACEHOLDER_URL}"', repr(empty_database))
        exec(compile(code, first.where, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own documentation
    finally:
        engine = namespace.get("engine")
        if isinstance(engine, sa.Engine):
            engine.dispose()
    assert "Traceback" not in capsys.readouterr().err


# -- sql -------------------------------------------------------------------------------------


def unmarked(kind: str) -> list[Block]:
    return [block for block in all_blocks() if block.kind == kind and not block.marker]


def test_the_unmarked_sql_blocks_run(fresh_database):
    engine = rl.create_engine(fresh_database)
    try:
        for block in unmarked("sql"):
            with engine.connect() as conn:
                with conn.begin() as transaction:
                    conn.exec_driver_sql(block.code)
                    transaction.rollback()
    finally:
        engine.dispose()


# -- configuration files ---------------------------------------------------------------------


def parse(block: Block) -> object:
    if block.kind == "ini":
        parser = configparser.RawConfigParser()
        parser.read_string(block.code)
        return {section: dict(parser[section]) for section in parser.sections()}
    if block.kind == "toml":
        import tomllib  # Python 3.11

        return tomllib.loads(block.code)
    if block.kind == "json":
        return json.loads(block.code)
    import yaml  # the dev extra brings it, with the documentation tools

    return yaml.safe_load(block.code)


@pytest.mark.parametrize("block", [b for kind in ("ini", "toml", "json", "yaml") for b in unmarked(kind)],
                         ids=lambda block: block.where)
def test_the_unmarked_configuration_blocks_parse(block):
    assert parse(block)


# -- shell -----------------------------------------------------------------------------------


def shell_lines(code: str) -> list[str]:
    """The commands of a shell block, without comments and blank lines."""
    return [line for line in (line.split(" #")[0].strip() for line in code.splitlines())
            if line and not line.startswith("#")]


def setup_extras() -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg", encoding="utf-8")
    return set(parser["options.extras_require"])


def check_pip_install(line: str) -> None:
    """A ``pip install`` of this clone (``.`` or ``-e .``), with extras that exist."""
    words = shlex.split(line)[2:]
    targets = [word for word in words if not word.startswith("-")]
    assert targets, line
    for target in targets:
        match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
        assert match, f"{line!r}: installs {target!r}, not this clone (the package is not on PyPI)"
        assert set(filter(None, (match.group(1) or "").split(","))) <= setup_extras(), line


def shell_blocks() -> list[Block]:
    return unmarked("sh")


@pytest.mark.parametrize("block", shell_blocks(), ids=lambda block: block.where)
def test_the_unmarked_shell_blocks_run(block, fresh_database, capsys):
    parser = build_parser()
    for line in shell_lines(block.code):
        program, *argv = shlex.split(line)
        if program == "pip":
            check_pip_install(line)
            continue
        if program == "export":
            continue
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{block.where}: {line!r} is refused by the argument parser: {capsys.readouterr().err}")
        words = tuple(word for word in (args.command, getattr(args, f"{args.command}_command", None)) if word)
        if words in READ_ONLY_COMMANDS and getattr(args, "url", None) is None:
            code = cli.main(["--database-url", fresh_database, *argv])
            out, err = capsys.readouterr()
            assert code == 0, f"{block.where}: {line!r} exited {code}: {out}{err}"


# -- marked blocks checked here --------------------------------------------------------------


def test_the_readme_starts_with_the_two_commands_that_work_on_a_fresh_machine():
    first_lines = README.read_text(encoding="utf-8").splitlines()[:8]
    commands = marked("make-commands", "sh")
    assert [line.split()[:2] for line in shell_lines(commands)] == [["make", "demo"], ["make", "test"]]
    assert commands.splitlines()[0] in [line.strip() for line in first_lines]
    targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M)
    assert {"demo", "test", "docs", "typecheck"} <= set(targets)


def test_the_readme_is_a_landing_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 250


@pytest.mark.parametrize("name", ["bench-default", "bench-capped"])
def test_the_benchmark_commands_use_flags_the_script_has(name):
    [line] = shell_lines(marked(name, "sh"))
    program, script, *argv = shlex.split(line)
    assert (program, script) == ("python", "bench/compare.py")
    shown = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    flags = [word for word in argv if word.startswith("--")]
    assert flags and all(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", shown.stdout) for flag in flags), flags
