"""How commands print records: JSON-ready data, JSON lines, aligned tables and times.

Everything a table or a line shows from stored data goes through
:func:`printable`, which escapes control characters as the text logs do
(:mod:`runledger_sync.core.escapes`). ``--json`` output needs no such care:
JSON escapes every control character.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Iterable, Optional, Sequence
from uuid import UUID

from runledger_sync.core.escapes import escape_controls


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


def printable(value: Any) -> str:
    """``value`` as text for a terminal: ``-`` for None, and every control character escaped visibly.

    Example:
        ``printable("a\\x1b[2Jb")`` is ``"a\\\\x1b[2Jb"``, printed as ``a\\x1b[2Jb``.
    """
    text = "-" if value is None else str(value)
    return escape_controls(text)


#: The most characters of a stored JSON value (payload, output, checkpoint) a table or field shows.
SHOWN_VALUE_CHARS = 2_000


def clipped(text: str, limit: int = SHOWN_VALUE_CHARS) -> str:
    """``text``, or its first ``limit`` characters with a note of how much was left out.

    Outputs and payloads run to megabytes; ``--json`` still prints them whole.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters not shown; --json prints the whole value)"


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
