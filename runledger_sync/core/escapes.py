"""Text from outside shown safely on one line: every control character escaped visibly.

Job types, organizations, error codes and messages, exception text: they come
from callers, handlers and upstream services, and a terminal or a log reader
acts on what they may hold. A newline starts what reads as another log record,
``\\x1b[2J`` clears the screen, a right-to-left override reorders the rest of
the line. The text logs and the command line's tables and lines print such
text through :func:`escape_controls`; JSON needs no such care, as JSON escapes
every control character.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (ESC starts a terminal's escape sequences), the line
# and paragraph separators (a new line inside a line), and the bidirectional
# marks and overrides (they reorder what the rest of the line shows), and lone
# surrogates (a badly encoded file name as Python decodes it), which no UTF-8
# stream can write: the record would be lost to an encoding error.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape, ``\\x1b`` or ``\\u2028``.

    Example:
        ``escape_controls("a\\nb\\x1b[2J")`` is ``"a\\\\x0ab\\\\x1b[2J"``, printed as ``a\\x0ab\\x1b[2J``.
    """
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
