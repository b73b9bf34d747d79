"""The claim: which due jobs a worker leases, how many each queue allows, and their start in the same round trip."""
