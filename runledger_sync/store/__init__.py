"""Every SQL statement of the queue, grouped by purpose; the runtime never writes SQL."""
