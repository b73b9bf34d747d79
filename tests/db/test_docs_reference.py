"""The reference pages list everything they claim to: every JobsConfig field, every command and
option of the command line, every error code, and every failure code the runtime records."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import html
import os
import re
import subprocess
import sys


import runledger_sync as rl
from runledger_sync.cli._core import build_parser
from runledger_sync.config_env import ENV_ALIASES
from runledger_sync.core import outcomes
from runledger_sync.core.error_tree import all_error_classes
from tests.db.test_docs import DOCS, page_text


def docs_hooks():
    """The MkDocs hook module that writes the generated parts of the reference."""
    spec = importlib.util.spec_from_file_location("runledger_docs_hooks", DOCS / "_hooks" / "runledger_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_table_lists_every_field_with_its_variables_and_default():
    table = {}
    for line in page_text("reference/configuration.md").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("field", "---"):
            table[cells[0]] = cells
    defaults = rl.JobsConfig()
    assert sorted(table) == sorted(field.name for field in dataclasses.fields(rl.JobsConfig))
    for name, (_, variables, default) in table.items():
        assert f"RUNLEDGER_{name.upper()}" in variables, name
        if name in ENV_ALIASES:
            assert ENV_ALIASES[name] in variables, name
        value = getattr(defaults, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert float(default.strip("`")) == value, name


def every_command(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser) for every command and subcommand, walked here independently of the hook."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_command(sub, (*path, name))


def test_the_command_line_reference_shows_every_command_and_every_option():
    assert "<!-- generated: cli-reference -->" in page_text("reference/cli.md")
    reference = docs_hooks().cli_reference()
    headings = set(re.findall(r"^### (runledger-sync .+)$", reference, re.M))
    commands = list(every_command(build_parser()))
    assert len(commands) > 20
    for path, parser in commands[1:]:
        assert f"runledger-sync {' '.join(path)}" in headings
        section = reference.split(f"### runledger-sync {' '.join(path)}\n", 1)[1].split("\n### ", 1)[0]
        if any(isinstance(action, argparse._SubParsersAction) for action in parser._actions):
            continue
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.default == argparse.SUPPRESS:
                continue  # the global options, shown once at the top
            for name in action.option_strings or [action.metavar or action.dest]:
                assert f"`{name}`" in section, f"runledger-sync {' '.join(path)}: {name}"
    for action in build_parser()._actions:
        for name in action.option_strings:
            assert f"`{name}`" in reference.split("\n### runledger-sync ", 1)[0] or name in ("-h", "--help")


def test_the_errors_page_lists_every_code_of_the_error_tree_and_every_recorded_failure_code():
    assert "<!-- generated: error-codes -->" in page_text("reference/errors.md")
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", docs_hooks().error_codes(), re.M))
    codes = {cls.code for cls in all_error_classes()}
    assert len(codes) > 50
    assert codes == listed
    page = page_text("reference/errors.md")
    recorded = {value for name, value in vars(outcomes).items() if name.endswith("_CODE")}
    assert len(recorded) >= 10
    assert {code for code in recorded if f"`{code}`" not in page} == set()


def test_the_home_page_is_the_readme_with_links_relative_to_the_docs():
    readme = page_text("README.md")
    home = docs_hooks().readme_for_site(readme)
    links = re.findall(r"\]\(([^)#]+)", home)
    local = [link for link in links if "://" not in link]
    assert local and all((DOCS / link).is_file() for link in local), local
    broken = [link for link in re.findall(r"\]\(([^)#]+)", readme) if "://" not in link and not (DOCS.parent / link).is_file()]
    assert broken == [], "these README links are broken on GitHub"


def test_the_built_site_documents_every_public_name(tmp_path):
    """``mkdocs build --strict`` succeeds, and the API reference has a section for each name of ``rl.__all__``."""
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=DOCS.parent, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    documented = set(re.findall(r'id="runledger_sync\.(\w+)"', api))
    assert len(rl.__all__) > 100
    assert set(rl.__all__) - documented == set()
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'id="what-it-is"' in home and 'href="getting-started.html"' in home  # the README, its links into the site

    # Opened from disk, a link to a directory shows a listing: every link inside the site names a file.
    directory_links = sorted({link for page in site.rglob("*.html")
                              for link in re.findall(r'href="([^"#:?]*/)"', page.read_text(encoding="utf-8"))})
    assert directory_links == []

    # The reference starts with what a user reaches for first and ends with the errors.
    order = re.findall(r'<h3 id="runledger_sync\.(\w+)"', api)
    assert sorted(order) == sorted(rl.__all__)
    assert order[:3] == ["create_engine", "migrate", "enqueue"]
    assert order.index("enqueue") < order.index("JobRegistry") < order.index("Supervisor") < order.index("get_job")
    errors = [name for name in rl.__all__ if isinstance(getattr(rl, name), type) and issubclass(getattr(rl, name), rl.RunledgerError)]
    assert set(order[-len(errors):]) == set(errors)

    # Defaults are shown as values: `timeout: float = 30.0`, not the constant that holds it.
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert "stop(timeout: float = 30.0)" in text
    assert re.findall(r"= (DEFAULT_\w+)", text) == ["DEFAULT_RETENTION"]  # an object, shown by name
