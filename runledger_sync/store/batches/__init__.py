"""Batches: open, add members, close, read, cancel (runledger_sync.core.batch)."""
