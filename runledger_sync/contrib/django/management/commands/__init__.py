"""runledger_worker and runledger_migrate."""
