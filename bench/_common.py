"""What every benchmark here shares: a fresh database, fast bulk enqueue, CPU and RSS from /proc, tables.

CPU figures come from /proc rather than from the process being measured, so the
same reading works for our worker, a peer's worker in another virtualenv, and the
PostgreSQL server. PostgreSQL CPU is the postmaster's own and reaped-children
time plus every live child's, so backends that exit mid-run still count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence
from urllib.parse import parse_qs, urlsplit

import psycopg2
import sqlalchemy
from psycopg2 import sql

import runledger_sync as rl

NOOP_TYPE = "bench.noop"
ENQUEUE_BATCH = 5_000
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def add_database_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", default=None,
        help="a server to use (fresh databases are created beside the one named); default: embedded PostgreSQL",
    )


# -- servers and databases -------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server on which fresh databases can be made; URLs are SQLAlchemy URLs."""

    admin_url: str

    def url(self, database: str) -> str:
        return sqlalchemy.engine.make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    def create_database(self, name: str) -> str:
        with _autocommit(self.admin_url) as cursor:
            cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with _autocommit(self.admin_url) as cursor:
            cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def server(database_url: Optional[str]) -> Iterator[Server]:
    """Yield the server at ``database_url``, or a throwaway embedded one when it is None."""
    if database_url is not None:
        yield Server(database_url)
        return
    embedded = rl.EmbeddedPostgres(os.path.join(tempfile.mkdtemp(prefix="rl-bench-"), "pgdata"), delete_on_stop=True)
    embedded.start()
    try:
        yield Server(embedded.url())
    finally:
        embedded.stop()


@contextlib.contextmanager
def fresh_database(srv: Server, name: str) -> Iterator[str]:
    """Yield the URL of a new, empty database that is dropped afterwards."""
    url = srv.create_database(name)
    try:
        yield url
    finally:
        srv.drop_database(name)


def libpq_url(url: str) -> str:
    """The same database as a plain libpq URI, for psycopg2, asyncpg, psycopg 3 and pgbench."""
    return sqlalchemy.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pgbench_connection_args(url: str) -> list[str]:
    """``-h/-p/-U`` options and the database name for pgbench, from a URL."""
    parts = urlsplit(libpq_url(url))
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    host = query.get("host", parts.hostname or "")
    port = query.get("port", str(parts.port or ""))
    args = [f"--host={host}"] if host else []
    args += [f"--port={port}"] if port else []
    args += [f"--username={parts.username}"] if parts.username else []
    return [*args, parts.path.lstrip("/")]


@contextlib.contextmanager
def _autocommit(url: str) -> Iterator[psycopg2.extensions.cursor]:
    connection = psycopg2.connect(libpq_url(url))
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            yield cursor
    finally:
        connection.close()


def migrated_engine(url: str, pool_size: int = 5) -> sqlalchemy.engine.Engine:
    engine = rl.create_engine(url, pool_size=pool_size)
    rl.migrate(engine)
    return engine


def noop_registry(handler=None) -> rl.JobRegistry:
    """A registry with the no-op type; ``handler(payload)`` runs inside it when given."""
    registry = rl.JobRegistry()

    @registry.job(NOOP_TYPE)
    def noop(ctx: rl.JobContext, payload: dict) -> None:
        if handler is not None:
            handler(payload)

    return registry


def enqueue_noops(engine: sqlalchemy.engine.Engine, count: int, *, batch: int = ENQUEUE_BATCH) -> float:
    """Enqueue ``count`` no-op jobs with ``enqueue_many``; return the seconds it took."""
    started = time.perf_counter()
    for offset in range(0, count, batch):
        rl.enqueue_many(engine, [rl.JobSpec(NOOP_TYPE, {"n": n}) for n in range(offset, min(count, offset + batch))])
    return time.perf_counter() - started


# -- /proc -----------------------------------------------------------------------


def _stat_fields(path: str) -> list[str]:
    with open(path) as handle:
        text = handle.read()
    # The command name may hold spaces and parentheses; fields resume after the last ")".
    return text[text.rindex(")") + 2:].split()


def process_cpu_seconds(pid: int, *, with_reaped_children: bool = False) -> float:
    """utime+stime of a process, all its threads included (and its waited-for children's)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLOCK_TICKS


def _parent_pid(pid: int) -> int:
    return int(_stat_fields(f"/proc/{pid}/stat")[1])


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if _parent_pid(int(entry)) == parent:
                found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process and all its live descendants (a worker that forks or spawns helpers)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += process_cpu_seconds(current, with_reaped_children=True)
            pending.extend(_children(current))
    return total


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE_KIB / 1024


class PostgresCpu:
    """CPU used by a local PostgreSQL server, minus the backends of our own observers.

    ``url`` opens a connection whose backend's parent is the postmaster; when the
    server is not visible in this machine's /proc (remote, another container),
    :attr:`available` is False and every reading is None.
    """

    def __init__(self, url: str) -> None:
        with _autocommit(url) as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
            self.postmaster: Optional[int] = _parent_pid(backend) if os.path.exists(f"/proc/{backend}") else None
        self.excluded: set[int] = set()

    @property
    def available(self) -> bool:
        return self.postmaster is not None

    def exclude_backend(self, backend_pid: int) -> None:
        """Leave out a backend that serves the benchmark itself, not the system measured."""
        self.excluded.add(backend_pid)

    def seconds(self) -> Optional[float]:
        if self.postmaster is None:
            return None
        total = process_cpu_seconds(self.postmaster, with_reaped_children=True)
        for child in _children(self.postmaster):
            if child not in self.excluded:
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    total += process_cpu_seconds(child)
        return total


@dataclass
class CpuWindow:
    """CPU seconds of a worker and of PostgreSQL between :meth:`start` and :meth:`stop`."""

    worker_cpu: Callable[[], float]
    postgres: PostgresCpu

    def start(self) -> None:
        self._worker0 = self.worker_cpu()
        self._postgres0 = self.postgres.seconds()

    def stop(self) -> None:
        self.worker_seconds = self.worker_cpu() - self._worker0
        postgres1 = self.postgres.seconds()
        self.postgres_seconds = None if postgres1 is None else postgres1 - self._postgres0

    def per_job_ms(self, jobs: int) -> tuple[float, Optional[float]]:
        pg = None if self.postgres_seconds is None else self.postgres_seconds * 1000 / jobs
        return self.worker_seconds * 1000 / jobs, pg


# -- figures ---------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def fmt(value: Optional[float], digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def fmt_range(values: Sequence[Optional[float]], digits: int = 0) -> str:
    """One figure, or ``low-high`` over several runs."""
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    low, high = min(known), max(known)
    return fmt(low, digits) if len(known) == 1 or fmt(low, digits) == fmt(high, digits) else f"{fmt(low, digits)}-{fmt(high, digits)}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    for line in [headers, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))))


#: How long each live job (payload key ``live``) enqueued in a window waited for its first lease.
_LIVE_PICKUPS = sqlalchemy.text(
    "SELECT extract(epoch FROM a.leased_at - q.created_at) * 1000 FROM job_queue q "
    "JOIN job_attempts a ON a.job_id = q.id WHERE q.created_at >= :since AND q.created_at < :until "
    "AND q.payload ? 'live'")


def live_pickups(engine: sqlalchemy.engine.Engine, since: object, until: object) -> list[float]:
    """Pickup latencies (ms, sorted) of the live jobs enqueued in ``[since, until)``."""
    with engine.connect() as connection:
        return sorted(float(ms) for ms in connection.execute(_LIVE_PICKUPS, {"since": since, "until": until}).scalars())


def pickup_summary(values: Sequence[float]) -> str:
    """``n``, p50, p95 and max of sorted pickup latencies, in one line."""
    if not values:
        return "no samples"
    return (f"n={len(values)} p50={percentile(values, 0.50):.1f} ms "
            f"p95={percentile(values, 0.95):.1f} ms max={values[-1]:.1f} ms")
