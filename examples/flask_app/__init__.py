"""A Flask app that enqueues a job in its request transaction (see README.md's Flask section)."""
