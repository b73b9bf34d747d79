"""Turn result rows into the core's record types."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, TypeVar

from sqlalchemy import and_
from sqlalchemy.engine import Result, Row

from runledger_sync.core.records import (
    DeadLetterRecord,
    JobAttemptRecord,
    JobDefinition,
    JobEventRecord,
    JobRecord,
)
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_definitions, job_events, job_queue

R = TypeVar("R")

#: JobRecord's fields whose column has another name: the spec's names stay in the schema.
_JOB_FIELD_COLUMNS = {"concurrency_key": "execution_resource_key"}
JOB_COLUMNS = tuple(
    job_queue.c[_JOB_FIELD_COLUMNS[f.name]].label(f.name) if f.name in _JOB_FIELD_COLUMNS else job_queue.c[f.name]
    for f in fields(JobRecord)
)
ATTEMPT_COLUMNS = tuple(job_attempts.c[f.name] for f in fields(JobAttemptRecord))
EVENT_COLUMNS = tuple(job_events.c[f.name] for f in fields(JobEventRecord))
#: The dead letter's failing attempt: the row its evidence (error type, traceback) is read from.
_FAILED_ATTEMPT = and_(job_attempts.c.job_id == job_dead_letters.c.job_id,
                       job_attempts.c.run_number == job_dead_letters.c.run_number,
                       job_attempts.c.attempt == job_dead_letters.c.attempt)
#: Read dead letters from here (DEAD_LETTER_COLUMNS name the attempt's columns too).
DEAD_LETTERS = job_dead_letters.outerjoin(job_attempts, _FAILED_ATTEMPT)
DEAD_LETTER_COLUMNS = tuple(
    job_attempts.c[f.name] if f.name in ("error_type", "traceback") else job_dead_letters.c[f.name]
    for f in fields(DeadLetterRecord)
)
DEFINITION_COLUMNS = tuple(job_definitions.c[f.name] for f in fields(JobDefinition))
_JOB_FIELDS = tuple(f.name for f in fields(JobRecord))


_STATUS_BY_VALUE = {status.value: status for status in JobStatus}
_STAGE_BY_VALUE = {stage.value: stage for stage in JobStage}


def to_jobs(result: Result[Any]) -> list[JobRecord]:
    """Every row of ``result`` as a JobRecord, cheaply when its columns are exactly JobRecord's fields.

    The claim decodes a batch of rows on every turn of the worker: building each
    record through the frozen dataclass's ``__init__`` (one ``object.__setattr__``
    per field) cost more than the rest of the decoding.
    """
    if tuple(result.keys()) != _JOB_FIELDS:
        return [to_job(row) for row in result]
    jobs = []
    for row in result:
        values = dict(zip(_JOB_FIELDS, row, strict=True))
        values["status"] = _STATUS_BY_VALUE[values["status"]]
        values["stage"] = _STAGE_BY_VALUE[values["stage"]]
        job = object.__new__(JobRecord)
        job.__dict__.update(values)
        jobs.append(job)
    return jobs


def to_job(row: Row[Any] | Mapping[str, Any]) -> JobRecord:
    mapping = row._mapping if isinstance(row, Row) else row
    values = {name: mapping[name] for name in _JOB_FIELDS}
    values["status"] = JobStatus(values["status"])
    values["stage"] = JobStage(values["stage"])
    return JobRecord(**values)


def to_record(cls: type[R], row: Row[Any]) -> R:
    return cls(**{f.name: row._mapping[f.name] for f in fields(cls)})  # type: ignore[arg-type]
