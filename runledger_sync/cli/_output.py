"""How commands print records: JSON-ready data, JSON lines, aligned tables and times."""

from __future__ import annotations

import argparse
import dataclasses
import json
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


def print_json(value: Any) -> None:
    print(json.dumps(plain(value), sort_keys=True))


def when(moment: Optional[datetime]) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if moment is not None else "-"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    cells = [[("-" if value is None else str(value)) for value in row] for row in rows]
    widths = [max([len(header)] + [len(row[index]) for row in cells]) for index, header in enumerate(headers)]
    for row in [list(headers)] + cells:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip())


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of a table")
