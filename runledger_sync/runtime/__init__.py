"""Threads and loops: the worker, the reaper, and the supervisor that runs them."""
