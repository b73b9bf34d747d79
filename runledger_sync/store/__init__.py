"""Every SQL statement of the queue, grouped by purpose; the runtime never writes SQL.

The public modules are the ones the architecture names: ``enqueue``,
``lifecycle``, ``admin``, ``schedules`` and ``workflows`` for applications and
operators, ``driver``, the one list of what the runtime asks of the
database, and ``aio_binds``, which runs those calls on an asyncio caller's
connection for :mod:`runledger_sync.aio`. The ``_``-prefixed modules are how those are done; only this package
imports them.
"""
