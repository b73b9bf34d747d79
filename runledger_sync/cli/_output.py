"""How commands print records: JSON-ready data, JSON lines, aligned tables and times.

Everything a table or a line shows from stored data goes through
:func:`printable`: job types, organizations, error codes and messages come from
callers, handlers and upstream services, and a terminal acts on the escape
sequences they may hold (``\\x1b[2J`` clears the screen). ``--json`` output
needs no such care: JSON escapes every control character.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from datetime import datetime, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Iterable, Optional, Sequence
from uuid import UUID


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data: records become dicts, UUIDs and times become text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


# C0 and C1 controls and DEL (ESC starts a terminal's escape sequences), the line
# and paragraph separators (a new line inside a cell), and the bidirectional
# marks and overrides (they reorder what the rest of the line shows).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(value: Any) -> str:
    """``value`` as text for a terminal: ``-`` for None, and every control character escaped visibly.

    Example:
        ``printable("a\\x1b[2Jb")`` is ``"a\\\\x1b[2Jb"``, printed as ``a\\x1b[2Jb``.
    """
    text = "-" if value is None else str(value)
    return _CONTROL.sub(_escaped, text)


#: The most characters of a stored JSON value (payload, output, checkpoint) a table or field shows.
SHOWN_VALUE_CHARS = 2_000


def clipped(text: str, limit: int = SHOWN_VALUE_CHARS) -> str:
    """``text``, or its first ``limit`` characters with a note of how much was left out.

    Outputs and payloads run to megabytes; ``--json`` still prints them whole.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters not shown; --json prints the whole value)"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def print_json(value: Any) -> None:
    print(json.dumps(plain(value), sort_keys=True))


def when(moment: Optional[datetime]) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if moment is not None else "-"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print ``rows`` under ``headers`` in aligned columns, every cell through :func:`printable`."""
    cells = [[printable(value) for value in row] for row in rows]
    widths = [max([len(header)] + [len(row[index]) for row in cells]) for index, header in enumerate(headers)]
    for row in [list(headers)] + cells:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of a table")
