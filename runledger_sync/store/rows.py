"""Turn result rows into the core's record types."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any, Mapping, TypeVar

from sqlalchemy import Text, and_, cast
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Result, Row

from runledger_sync.core.records import (
    DeadLetterRecord,
    JobAttemptRecord,
    JobDefinition,
    JobEventRecord,
    JobRecord,
)
from runledger_sync.core.encryption import SEALED_PREFIX, open_text
from runledger_sync.core.states import JobStage, JobStatus
from runledger_sync.store.sealing import opened
from runledger_sync.db.schema import job_attempts, job_dead_letters, job_definitions, job_events, job_queue

R = TypeVar("R")

#: JobRecord's fields whose column has another name: the spec's names stay in the schema.
_JOB_FIELD_COLUMNS = {"concurrency_key": "execution_resource_key"}
#: JobRecord's one field that is no column: what the enqueue that returned the record did.
DISPOSITION = "disposition"
JOB_COLUMNS = tuple(
    job_queue.c[_JOB_FIELD_COLUMNS[f.name]].label(f.name) if f.name in _JOB_FIELD_COLUMNS else job_queue.c[f.name]
    for f in fields(JobRecord) if f.name != DISPOSITION
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
_JOB_FIELDS = tuple(column.key for column in JOB_COLUMNS)
#: A row of the columns and the enqueue's disposition.
_DISPOSED_FIELDS = (*_JOB_FIELDS, DISPOSITION)
#: JobRecord's fields held in jsonb columns (payload, checkpoint, output, ...).
_JSON_FIELDS = tuple(column.name for column in JOB_COLUMNS if isinstance(column.type, JSONB))
#: JOB_COLUMNS with each jsonb column sent as its text, for :func:`to_jobs` to decode.
JOB_TEXT_COLUMNS = tuple(
    cast(column, Text).label(column.name) if column.name in _JSON_FIELDS else column for column in JOB_COLUMNS
)


#: The fields that may hold a sealed value (see runledger_sync.core.encryption).
_SEALABLE_FIELDS = ("payload", "checkpoint", "output")

_STATUS_BY_VALUE = {status.value: status for status in JobStatus}
_STAGE_BY_VALUE = {stage.value: stage for stage in JobStage}


#: jsonb's text output is one JSON value with nothing around it: raw_decode needs no
#: check for trailing text, which json.loads makes on every value.
_decode_json = json.JSONDecoder().raw_decode


def to_jobs(result: Result[Any]) -> list[JobRecord]:
    """Every row of ``result``, a statement returning :data:`JOB_TEXT_COLUMNS` (and maybe a disposition), as a JobRecord.

    The claim decodes a batch of rows on every turn of the worker, so the records
    are built in place: each row's values go straight into a new record's
    ``__dict__`` (the frozen dataclass's ``__init__`` costs one
    ``object.__setattr__`` per field), and each JSON value is decoded by one call
    here rather than by the driver's typecaster, one Python call deeper per column.
    """
    keys = tuple(result.keys())
    if keys not in (_JOB_FIELDS, _DISPOSED_FIELDS):
        raise ValueError(f"to_jobs reads rows of JOB_TEXT_COLUMNS, not of {keys}")
    jobs = []
    new = object.__new__
    decode = _decode_json
    for row in result.all():
        job = new(JobRecord)
        values = job.__dict__
        values[DISPOSITION] = None
        values.update(zip(keys, row, strict=False))  # the width was checked with the keys
        values["status"] = _STATUS_BY_VALUE[values["status"]]
        values["stage"] = _STAGE_BY_VALUE[values["stage"]]
        for name in _JSON_FIELDS:
            text = values[name]
            if text is not None:
                # One prefix test per value: a clear value costs nothing more.
                values[name] = open_text(text, values["id"]) if text.startswith(SEALED_PREFIX) else decode(text)[0]
        jobs.append(job)
    return jobs


def to_job(row: Row[Any] | Mapping[str, Any]) -> JobRecord:
    mapping = row._mapping if isinstance(row, Row) else row
    values = {name: mapping[name] for name in _JOB_FIELDS}
    values[DISPOSITION] = mapping.get(DISPOSITION)
    for name in _SEALABLE_FIELDS:
        values[name] = opened(values[name], values["id"])
    values["status"] = JobStatus(values["status"])
    values["stage"] = JobStage(values["stage"])
    return JobRecord(**values)


def to_record(cls: type[R], row: Row[Any]) -> R:
    return cls(**{f.name: row._mapping[f.name] for f in fields(cls)})  # type: ignore[arg-type]


def to_dead_letter(row: Row[Any]) -> DeadLetterRecord:
    """A dead letter, its snapshots opened: they keep its job's sealed values as they were, bound to the job id."""
    record = to_record(DeadLetterRecord, row)
    return replace(record, payload_snapshot=opened(record.payload_snapshot, record.job_id),
                   checkpoint_snapshot=opened(record.checkpoint_snapshot, record.job_id))
