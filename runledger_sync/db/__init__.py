"""Engines, the table definitions, migrations and the embedded server."""
