"""Filters for your application's own Alembic ``env.py`` when runledger's tables share its database.

Autogenerate compares your ``target_metadata`` with every table it reflects.
Runledger's tables and its version table are not in your metadata, so without
a filter ``alembic revision --autogenerate`` proposes dropping them and
``alembic check`` fails. Pass one of these to ``context.configure()``::

    from runledger_sync.db.alembic_host import include_object

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)

Both hide the same tables. :func:`include_object` also hides copies of our
tables in your own metadata (you may copy ``job_queue`` there so a foreign key
of yours has a target); :func:`include_name` skips reflecting them at all. To
combine one with a filter of your own, call both: ``include_object(...) and
mine(...)``.
"""

from __future__ import annotations

from typing import Any

from runledger_sync.db.migrate import VERSION_TABLE
from runledger_sync.db.schema import metadata

#: The tables runledger-sync's history creates, plus its own version table.
RUNLEDGER_TABLES = frozenset({table.name for table in metadata.tables.values()} | {VERSION_TABLE})


def include_name(name: Any, type_: str, parent_names: Any) -> bool:
    """Return False for runledger's tables, so autogenerate never reflects them.

    Args:
        name: the reflected object's name.
        type_: ``"schema"``, ``"table"``, ``"column"``, ``"index"``, ...
        parent_names: Alembic's dict of the enclosing schema and table names.

    Returns:
        True for everything but a table named in :data:`RUNLEDGER_TABLES`; the
        columns, indexes and constraints of a skipped table are never compared.
    """
    return type_ != "table" or name not in RUNLEDGER_TABLES


def include_object(object_: Any, name: Any, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Return False for runledger's tables, found in the database or in your metadata.

    Args:
        object_: the SQLAlchemy object (Table, Column, Index, ...).
        name: its name.
        type_: ``"table"``, ``"column"``, ``"index"``, ``"unique_constraint"``, ...
        reflected: True when it came from the database.
        compare_to: its counterpart on the other side, or None.

    Returns:
        True for everything but a table named in :data:`RUNLEDGER_TABLES`.
    """
    return type_ != "table" or name not in RUNLEDGER_TABLES
