"""A Griffe extension for the API reference: the library's docstrings read as Markdown.

- ``Example:`` sections are read as examples: Griffe's Google-style parser reads only
  ``Examples:`` as code, and the singular as plain text, where ``>>>`` would render as
  nested quotes.
- Sphinx roles (``:func:`enqueue```, ``:class:`~runledger_sync.JobsConfig```) become code
  spans of the name (its last part with ``~``), instead of showing the role's markup.
- A default written as a constant (``timeout: float = DEFAULT_DRAIN_TIMEOUT_SECONDS``) is
  shown as its value (``30.0``): the reader wants the number, and the constant's name is
  in the source. Only names and dotted names whose value is a plain literal are replaced.
"""

from __future__ import annotations

import enum
import importlib
from datetime import timedelta
import re
from typing import Any, Iterator, Optional

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


#: Values shown in place of the constant that names them; anything else keeps its source text.
_LITERALS = (bool, int, float, str, type(None), timedelta)
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class RuntimeDefaults(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        # on_package: after Griffe's own dataclass extension has written each dataclass's __init__.
        for obj in _objects(pkg):
            if obj.is_function:
                for function in (obj, *(obj.overloads or ())):
                    for parameter in function.parameters:
                        value = _literal(obj, parameter.default)
                        if value is not None:
                            parameter.default = value
            elif obj.is_attribute:
                value = _literal(obj, obj.value)
                if value is not None:
                    obj.value = value


def _objects(obj: griffe.Object) -> Iterator[Any]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield member
        if member.is_module or member.is_class:
            yield from _objects(member)


def _literal(obj: Any, default: object) -> Optional[str]:
    """``repr`` of the value a constant default names, or None to keep the source text."""
    if default is None or not _DOTTED_NAME.fullmatch(str(default)) or str(default) in ("None", "True", "False"):
        return None
    try:
        value: Any = importlib.import_module(obj.module.path)
        for part in str(default).split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value) if type(value) in _LITERALS else None
