"""The queue's live figures in one statement, cheap enough to read on every Prometheus scrape.

Each part of the statement names a predicate that a partial index holds (or a
time range on an index), so a scrape reads the unfinished jobs, the last hour
of dead letters and the due schedules, and never the finished jobs that make up
most of a long-lived job_queue:

- PENDING jobs (held-back ones too) through idx_job_queue_resting_status, LEASED
  ones through idx_job_queue_leased_expiry (both partial on status);
- dead letters of the last hour through idx_job_dead_letters_failed_at;
- due schedules through idx_job_schedules_due;
- the job types from job_definitions (a row per type), so a type with no
  unfinished jobs reads as zero rather than as missing.

Finished jobs are not counted here: a count of SUCCEEDED rows reads every one of
them. The worker counts the jobs it finishes instead (runledger_sync.metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

from sqlalchemy import Float, Integer, Interval, Text, func, literal, null, select, union_all
from sqlalchemy.engine import Connection

from runledger_sync.core.states import JobStatus
from runledger_sync.db.schema import job_dead_letters, job_definitions, job_queue
from runledger_sync.db.schema_schedules import job_schedules
from runledger_sync.store.binds import Bind
from runledger_sync.store.transactions import run_in_transaction
from runledger_sync.store.scope import status_is

_q = job_queue.c
_d = job_dead_letters.c
_s = job_schedules.c

#: The window of the recent dead-letter count.
DEAD_LETTER_WINDOW_SECONDS = 3600
#: A due schedule counts as late once it has waited this long: a healthy
#: scheduler fires within a poll interval, and a failed fire is tried again in 30 s.
LATE_SCHEDULE_SECONDS = 60


@dataclass(frozen=True)
class QueueGauges:
    """The unfinished part of the queue, by job type.

    Attributes:
        job_types: Every defined job type, sorted.
        jobs: Jobs per (job type, status), for PENDING and LEASED only.
        due: PENDING jobs whose next_run_at has come, per job type.
        oldest_due_age_seconds: Per job type, how long its longest-waiting due job has been due.
        expired_leases: LEASED jobs whose lease has run out (the reaper's work), per job type.
        dead_lettered_recently: Dead letters of the last ``DEAD_LETTER_WINDOW_SECONDS``, per job type.
        late_schedules: Active schedules due for longer than ``LATE_SCHEDULE_SECONDS``.
        max_schedule_lateness_seconds: How long the most overdue active schedule has been due; None if none is due.
    """

    job_types: tuple[str, ...]
    jobs: dict[tuple[str, str], int]
    due: dict[str, int]
    oldest_due_age_seconds: dict[str, float]
    expired_leases: dict[str, int]
    dead_lettered_recently: dict[str, int]
    late_schedules: int
    max_schedule_lateness_seconds: Optional[float]


def _row(kind: str, job_type: Any, status: Any, count: Any, part: Any, age: Any) -> list[Any]:
    return [
        literal(kind, Text).label("kind"), job_type.label("job_type"), status.label("status"),
        count.label("n"), part.label("part"), age.label("age_seconds"),
    ]


def _age(since: Any) -> Any:
    return func.extract("epoch", func.now() - since)


def queue_gauges_statement() -> Any:
    """The one statement behind :func:`queue_gauges`: rows of (kind, job_type, status, n, part, age_seconds)."""
    now = func.now()
    due = _q.next_run_at <= now
    pending = select(*_row(
        "jobs", _q.job_type, literal(JobStatus.PENDING.value, Text), func.count(),
        func.count().filter(due), _age(func.min(_q.next_run_at).filter(due)),
    )).where(status_is(JobStatus.PENDING)).group_by(_q.job_type)
    leased = select(*_row(
        "jobs", _q.job_type, literal(JobStatus.LEASED.value, Text), func.count(),
        func.count().filter(_q.lease_expires_at < now), null().cast(Float),
    )).where(status_is(JobStatus.LEASED)).group_by(_q.job_type)
    window = literal(timedelta(seconds=DEAD_LETTER_WINDOW_SECONDS), Interval)
    dead = select(*_row(
        "dead_letters", _d.job_type, null().cast(Text), func.count(), null().cast(Integer), null().cast(Float),
    )).where(_d.failed_at > now - window).group_by(_d.job_type)
    late_after = literal(timedelta(seconds=LATE_SCHEDULE_SECONDS), Interval)
    schedules = select(*_row(
        "schedules", null().cast(Text), null().cast(Text), func.count(),
        func.count().filter(_s.next_fire_at < now - late_after), _age(func.min(_s.next_fire_at)),
    )).where(_s.is_active, _s.next_fire_at <= now)
    types = select(*_row(
        "types", job_definitions.c.job_type, null().cast(Text), literal(0, Integer), null().cast(Integer),
        null().cast(Float),
    ))
    return union_all(pending, leased, dead, schedules, types)


def queue_gauges(bind: Bind) -> QueueGauges:
    """Read the unfinished jobs, recent dead letters and late schedules in one round trip.

    Args:
        bind: an Engine (its own transaction), or a Connection, ORM Session or
            psycopg connection whose open transaction the read joins.
    """
    statement = queue_gauges_statement()

    def work(connection: Connection) -> QueueGauges:
        jobs: dict[tuple[str, str], int] = {}
        due: dict[str, int] = {}
        ages: dict[str, float] = {}
        expired: dict[str, int] = {}
        dead: dict[str, int] = {}
        types: list[str] = []
        late, max_lateness = 0, None
        for kind, job_type, status, count, part, age in connection.execute(statement):
            if kind == "types":
                types.append(job_type)
            elif kind == "dead_letters":
                dead[job_type] = int(count)
            elif kind == "schedules":
                late, max_lateness = int(part), None if age is None else float(age)
            else:
                jobs[(job_type, status)] = int(count)
                if status == JobStatus.LEASED.value:
                    expired[job_type] = int(part)
                else:
                    due[job_type] = int(part)
                    if age is not None:
                        ages[job_type] = float(age)
        return QueueGauges(job_types=tuple(sorted(types)), jobs=jobs, due=due, oldest_due_age_seconds=ages, expired_leases=expired,
                           dead_lettered_recently=dead, late_schedules=late, max_schedule_lateness_seconds=max_lateness)

    return run_in_transaction(bind, work)


def ping(bind: Bind) -> None:
    """Raise a StoreError (ConnectionFailed when unreachable) unless the database answers a trivial query."""
    run_in_transaction(bind, lambda connection: connection.execute(select(literal(1))).scalar_one())
