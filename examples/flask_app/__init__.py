"""A Flask app that enqueues a job in its request transaction (see docs/guides/flask.md)."""
