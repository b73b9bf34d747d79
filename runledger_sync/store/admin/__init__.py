"""Operator reads and actions on jobs: get, list, count, cancel, requeue, dead letters, stats, gauges, overview, rollup."""
