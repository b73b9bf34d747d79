"""Kill a primary mid-run and promote its standby; print what was lost, with synchronous or asynchronous replication.

Usage: python bench/failover.py [--replication async|sync|both] [--runs 3] [--jobs 3000] [--lag-ms 0,200]

Each run builds a primary and a streaming standby on this machine with PostgreSQL's
own programs (``initdb``, ``pg_basebackup -R``, ``pg_ctl``; under
/usr/lib/postgresql/*/bin), starts two worker processes on a multi-host URL
(``target_session_attrs=read-write``), enqueues the jobs (half before the workers
start, half across the failover), kills the primary with ``pg_ctl stop -m
immediate`` a third of the way through and promotes the standby. It is the
scenario ``tests/faults/test_failover.py`` runs synchronously
(``tests/faults/failover.py``). ``--lag-ms`` runs each case again with the stream to
the standby held back that long before the kill (the standby streams through a TCP
relay that holds the bytes, then drops them with the primary): a standby as far
behind as a congested network or a busy standby leaves it. The columns:

- lost enqueues: enqueues acknowledged before the kill whose job the promoted server lacks.
- lost outcomes: jobs a reader saw SUCCEEDED on the primary before the kill that ran
  again after it (the standby never received the success).
- reruns: jobs run more than once (in flight at the kill, or their outcome lost); not in
  flight: first run after the kill, or finished before it (their success lost).
- to all succeeded: seconds from the promotion until every job had SUCCEEDED.
- WAL behind at kill: bytes of WAL the primary had written and the standby not yet
  flushed, read a moment before the kill (the window asynchronous replication can lose).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The scenario lives beside the tests, so the figures and CI can never drift apart.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.failover import run_failover  # noqa: E402
from tests.faults.replication import ReplicatedPair, binaries  # noqa: E402

COLUMNS = ("replication", "lag ms", "jobs", "acked at kill", "succeeded at kill", "lost enqueues", "lost outcomes",
           "reruns", "reruns not in flight", "dead-lettered", "to all succeeded s", "WAL behind at kill")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replication", choices=("async", "sync", "both"), default="async")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--lag-ms", default="0", help="comma-separated replication lags to run (default: 0)")
    args = parser.parse_args()
    bindir, missing = binaries()
    if bindir is None:
        print(f"cannot build a primary and a standby here: {missing}", file=sys.stderr)
        return 2
    kinds = {"async": [False], "sync": [True], "both": [True, False]}[args.replication]
    print(" | ".join(COLUMNS))
    lags = [int(lag) for lag in args.lag_ms.split(",")]
    for synchronous in kinds:
        for lag in lags:
            for _ in range(args.runs):
                run(bindir, synchronous, lag, args.jobs)
    return 0


def run(bindir: Path, synchronous: bool, lag_ms: int, jobs: int) -> None:
    with ReplicatedPair(bindir, synchronous=synchronous, relayed=lag_ms > 0) as pair:
        report = run_failover(pair, jobs=jobs, lag_seconds=lag_ms / 1000)
    print(" | ".join(str(value) for value in (
        "sync" if synchronous else "async", lag_ms, report.jobs, report.acknowledged_at_kill, report.succeeded_at_kill,
        report.lost_enqueues, report.lost_outcomes, report.reruns, report.reruns_not_in_flight, report.dead_lettered,
        report.seconds_to_all_succeeded, report.wal_behind_bytes_at_kill)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
