"""One claimed job's attempt after its claim: the lease fence, the writes while it runs, and its outcome."""
