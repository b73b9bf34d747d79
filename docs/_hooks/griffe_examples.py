"""A Griffe extension for the API reference: ``Example:`` sections are read as examples.

The library's docstrings head their doctests ``Example:``; Griffe's Google-style parser
reads only ``Examples:`` as an examples section (code), and the singular as an
admonition of plain text, where ``>>>`` would render as nested quotes.
"""

from __future__ import annotations

import re

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
