"""Workflow runs: enqueue one, read it back, act on it, and end its steps with their jobs."""
