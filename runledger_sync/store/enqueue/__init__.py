"""Enqueue: check and write jobs, one statement per chunk of a batch."""
