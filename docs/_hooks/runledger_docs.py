"""MkDocs hooks: the README is the site's home page, and two reference pages are written from the code.

- ``index.md`` is README.md with its ``docs/`` links made relative to the site, so the
  README's links work both on GitHub and in the site.
- ``<!-- generated: cli-reference -->`` becomes every command and option of the
  ``runledger-sync`` argument parser, so the command-line reference cannot drift.
- ``<!-- generated: error-codes -->`` becomes every class of the error tree with its code,
  so the errors page lists every code the library can raise, and where to import the
  class from (``rl`` for the common ones, ``rl.errors`` for every one).

The tests (tests/db/test_docs_reference.py) import these functions and check what they write.
"""

from __future__ import annotations

import argparse
import html
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CLI_MARKER = "<!-- generated: cli-reference -->"
ERRORS_MARKER = "<!-- generated: error-codes -->"


def readme_for_site(text: str) -> str:
    """The README with links into ``docs/`` made relative to the docs directory."""
    return re.sub(r"\]\(docs/", "](", text)


def _cell(text: str) -> str:
    text = html.escape(" ".join(str(text).split()), quote=False)
    return text.replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        names = action.option_strings or [action.metavar or action.dest]
        if set(names) & skip:
            continue
        shown = ", ".join(f"`{name}`" for name in names)
        if action.option_strings and action.nargs != 0:
            shown += f" `{action.metavar or action.dest.upper()}`"
        if action.choices and not isinstance(action.choices, dict):
            shown += " (" + ", ".join(f"`{choice}`" for choice in action.choices) + ")"
        help_text = formatter._expand_help(action) if action.help and action.help != argparse.SUPPRESS else ""
        rows.append(f"| {shown} | {_cell(help_text)} |")
    return rows


def command_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's parser under ``parser``, depth first, with its words."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(command_parsers(sub, (*path, name)))
    return found


def cli_reference() -> str:
    """Markdown for every command of ``runledger-sync``: its usage and a table of its arguments."""
    from runledger_sync.cli._core import build_parser

    root = build_parser()
    global_names = {name for action in root._actions for name in action.option_strings}
    parts = ["### Global options", "",
             "Every command takes these, before or after the command's name.", "",
             "| option | meaning |", "|---|---|", *_option_rows(root, {"-h", "--help"}), ""]
    for path, parser in command_parsers(root)[1:]:
        has_children = any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)
        parts += [f"### runledger-sync {' '.join(path)}", ""]
        if parser.description:
            parts += [_cell(parser.description), ""]
        if has_children:
            continue
        usage = " ".join(parser.format_usage().split())
        parts += ["```text", usage.removeprefix("usage: "), "```", ""]
        rows = _option_rows(parser, global_names | {"-h", "--help"})
        if rows:
            parts += ["| argument | meaning |", "|---|---|", *rows, ""]
    return "\n".join(parts)


def error_codes() -> str:
    """Markdown tables of the error tree: each class, its code, its parent and its default message."""
    import runledger_sync
    from runledger_sync.cli._core import DEFAULT_HINT, HINTS
    from runledger_sync.core.error_tree import all_error_classes
    from runledger_sync.core.errors import RunledgerError

    rows = ["| code | class | derives from | meaning | command-line hint |", "|---|---|---|---|---|"]
    for cls in sorted(all_error_classes(), key=lambda cls: (cls.code, cls.__name__)):
        parent = "BaseException" if not issubclass(cls, RunledgerError) else (
            cls.__mro__[1].__name__ if cls is not RunledgerError else "Exception")
        meaning = (cls.__doc__ or "").strip().split("\n\n")[0]
        home = "rl" if cls.__name__ in runledger_sync.__all__ else "rl.errors"
        rows.append(f"| `{cls.code}` | `{home}.{cls.__name__}` | `{parent}` | {_cell(meaning)} | "
                    f"{_cell(HINTS.get(cls.code, DEFAULT_HINT))} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == "index.md":
        return readme_for_site(README.read_text(encoding="utf-8"))
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if ERRORS_MARKER in markdown:
        markdown = markdown.replace(ERRORS_MARKER, error_codes())
    return markdown
