"""Upkeep no request asks for: recovering expired leases, pruning old rows, firing due schedules."""
