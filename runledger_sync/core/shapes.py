"""Words for a value's type and shape, never its content.

Error messages about payloads, outputs and checkpoints use these words instead of
the value: those may hold personal data or secrets, and an error message ends up
in logs, job rows and terminals. ``a dict holding a set at key 's'`` tells the
caller what to fix without repeating what they sent.
"""

from __future__ import annotations

import math
import sys
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, Optional
from uuid import UUID

#: Deeper than this, a value is reported as too deeply nested (json.dumps itself
#: stops near the interpreter's recursion limit of about 1000).
MAX_DEPTH = 500
#: Longest key shown in a path; keys are names, but a long one is cut.
MAX_KEY_CHARACTERS = 40
#: Most steps of a path shown before it is cut.
_MAX_PATH_STEPS = 6
#: Longest text an argument error repeats as given.
MAX_ECHOED_TEXT = 200
#: Most decimal digits of an int a payload may hold. Python refuses to write a
#: longer one as text by default (sys.get_int_max_str_digits), and it is far
#: inside what PostgreSQL's numeric, and so jsonb, holds (131,072 digits).
MAX_INT_DIGITS = 4_300
_INT_LIMIT = 10**MAX_INT_DIGITS

_SCALARS = (bool, int, float, Decimal, UUID, datetime, date, time, timedelta, Enum, type(None))
# Type names that read as nouns ("a dict holding a set"); others read as "a value of type X".
_NOUNS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool"})


def type_phrase(value: Any) -> str:
    """Return ``a set``, ``an int``, ``None`` or ``a value of type bytes``: the value's type in words."""
    if value is None:
        return "None"
    name = type(value).__name__
    if name not in _NOUNS:
        return f"a value of type {name}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def echo_or_shape(value: Any) -> str:
    """Return ``repr(value)`` for a short scalar argument, else only its type.

    An argument error may repeat a limit of -1 or a job type, but not a dict or
    a list: one passed in the wrong place may well be a payload.
    """
    if isinstance(value, int) and int_too_long(value):
        # repr() itself would raise ValueError past the interpreter's digit limit.
        return f"an int of more than {int_digit_limit()} digits"
    if isinstance(value, _SCALARS) or (isinstance(value, str) and len(value) <= MAX_ECHOED_TEXT):
        return repr(value)
    if isinstance(value, str):
        return f"a str of {len(value)} characters"
    return f"a value of type {type(value).__name__}"


def int_digit_limit() -> int:
    """The most digits a stored int may have: ours, or the interpreter's lower limit."""
    interpreter = sys.get_int_max_str_digits()
    # 0 means the interpreter has no limit.
    return MAX_INT_DIGITS if interpreter == 0 else min(MAX_INT_DIGITS, interpreter)


def int_too_long(value: int) -> bool:
    """True when ``value`` has more digits than :func:`int_digit_limit`, found without writing it out."""
    limit = int_digit_limit()
    bound = _INT_LIMIT if limit == MAX_INT_DIGITS else 10**limit
    return not -bound < value < bound


def json_problem(value: Any) -> Optional[str]:
    """Return where and what the first part of ``value`` is that jsonb cannot hold, or None.

    Example:
        ``json_problem({"s": {1, 2}})`` is ``"a dict holding a set at key 's'"``.
    """
    # Iterative, so a value nested past the recursion limit is still described.
    stack: list[tuple[Any, tuple[Any, ...], frozenset[int]]] = [(value, (), frozenset())]
    while stack:
        node, path, ancestors = stack.pop()
        leaf = _leaf_problem(node, path, ancestors)
        if leaf is not None:
            return _at(value, path, leaf)
        if isinstance(node, dict):
            inner = ancestors | {id(node)}
            for key, item in reversed(list(node.items())):
                key_problem = _key_problem(key)
                if key_problem is not None:
                    return _at(value, path, f"a dict with {key_problem}")
                stack.append((item, path + (key,), inner))
        elif isinstance(node, (list, tuple)):
            inner = ancestors | {id(node)}
            stack.extend((item, path + (index,), inner) for index, item in reversed(list(enumerate(node))))
    return None


def _leaf_problem(node: Any, path: tuple[Any, ...], ancestors: frozenset[int]) -> Optional[str]:
    if isinstance(node, (dict, list, tuple)):
        if id(node) in ancestors:
            return f"{type_phrase(node)} that contains itself"
        if len(path) >= MAX_DEPTH:
            return f"a value nested more than {MAX_DEPTH} levels deep"
        return None
    if isinstance(node, str):
        return _text_problem(node, "a string")
    if isinstance(node, float):
        return None if math.isfinite(node) else "a float that is NaN or infinite"
    if isinstance(node, int) and not isinstance(node, bool) and int_too_long(node):
        return f"an int of more than {int_digit_limit()} digits"
    if isinstance(node, (int, bool)) or node is None:
        return None
    return type_phrase(node)


def _key_problem(key: Any) -> Optional[str]:
    # JSON keys are text. json.dumps would write 1 and None as "1" and "null",
    # and {1: "a", "1": "b"} would then be stored as {"1": "b"}: refused instead.
    if not isinstance(key, str):
        return f"a key of type {type(key).__name__} (JSON keys are strings)"
    return _text_problem(key, "a key")


def _text_problem(text: str, what: str) -> Optional[str]:
    if "\x00" in text:
        return f"{what} containing a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} containing a lone surrogate"
    return None


def _at(root: Any, path: tuple[Any, ...], leaf: str) -> str:
    if not path:
        return leaf
    if len(path) == 1:
        where = f"key {_key_text(path[0])}" if isinstance(root, dict) else f"index {path[0]}"
    elif len(path) <= _MAX_PATH_STEPS:
        where = "".join(f"[{_key_text(step)}]" for step in path)
    else:
        shown = "".join(f"[{_key_text(step)}]" for step in path[:_MAX_PATH_STEPS])
        where = f"{shown}... ({len(path)} levels down)"
    return f"{type_phrase(root)} holding {leaf} at {where}"


def _key_text(key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)  # a list index: always short
    text = repr(key)
    return text if len(text) <= MAX_KEY_CHARACTERS else text[: MAX_KEY_CHARACTERS - 4] + "...'"
