"""The supervisor: starts, watches and stops the loops, in one process or several."""
