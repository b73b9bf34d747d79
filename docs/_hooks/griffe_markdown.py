"""A Griffe extension for the API reference: the library's docstrings read as Markdown.

- ``Example:`` sections are read as examples: Griffe's Google-style parser reads only
  ``Examples:`` as code, and the singular as plain text, where ``>>>`` would render as
  nested quotes.
- Sphinx roles (``:func:`enqueue```, ``:class:`~runledger_sync.JobsConfig```) become code
  spans of the name (its last part with ``~``), instead of showing the role's markup.
"""

from __future__ import annotations

import re

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.M)
SPHINX_ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class MarkdownDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = SPHINX_ROLE.sub(_role, value)
