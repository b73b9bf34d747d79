"""Every SQL statement of the queue, grouped by purpose; the runtime never writes SQL.

The whole package is private: users reach it through ``runledger_sync`` (``rl.*``),
``.aio``, ``.testing``, ``.web`` and ``.contrib``, and the runtime through
:mod:`runledger_sync.store.driver` alone, the one list of what it asks of the database.
Each folder holds one part of a job's life, each plain module one idea:

- ``enqueue/``: writing jobs; ``definitions``, ``queues``, ``schedules``: the rows
  that shape them; ``workers``: who serves what;
- ``claim/``: leasing due jobs to a worker; ``attempt/``: everything written
  under a lease, from running to the outcome;
- ``workflows/``: runs and their steps; ``maintenance/``: the reaper, retention,
  the schedule tick; ``admin/``: the operator's reads and actions;
- under them all: ``transactions`` (whose transaction, and retries), ``binds``,
  ``aio_binds`` and ``held`` (what a call runs on), ``prepared``, ``sql``,
  ``rows``, ``scope`` and ``notify``.
"""
