"""The worker: its polling thread, its listener, and what it counts and limits while it claims."""
