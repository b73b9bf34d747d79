"""What a test asserts about the queue: :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`refute_enqueued`.

A filter names a :class:`~runledger_sync.JobRecord` field (``queue="mail"``,
``priority=5``, ``organization_id="acme"``, ``concurrency_key="customer:42"``,
``status=...``). Without ``status`` only PENDING jobs count: those enqueued and
not yet run (due now or later). ``status=None`` counts every job.

A payload filter matches when the job's payload contains it: every key given
has that value in the job's payload, compared the same way inside nested
objects; any other value (a list, a number) must be equal.

A failed assertion shows what was enqueued instead: each job of the type with
its id, its payload and the filters it differs on, and how many jobs of other
types wait. Payloads are the test's own data, so they are shown (cut to
:data:`SHOWN_PAYLOAD_CHARS` characters each); the library's logs never show them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Optional

from sqlalchemy.engine import Engine

from runledger_sync.core import validation as check
from runledger_sync.core.errors import InvalidArgument
from runledger_sync.core.records import JobRecord
from runledger_sync.core.states import JobStatus
from runledger_sync.store.admin.jobs import list_jobs

#: How much of one payload a failure message shows.
SHOWN_PAYLOAD_CHARS = 200
#: How many jobs of the asked type a failure message lists, at most.
SHOWN_JOBS = 10
#: The field names a filter may use: every JobRecord field.
# disposition is an enqueue's answer, never a stored row's.
FILTERS = frozenset(f.name for f in fields(JobRecord)) - {"id", "job_type", "disposition"}
_PAGE = check.LIMIT_RANGE[1]
_ANY = object()


def enqueued_jobs(engine: Engine, job_type: Optional[str] = None, **filters: Any) -> list[JobRecord]:
    """Return the jobs matching ``filters`` (PENDING ones unless ``status`` says otherwise), oldest first.

    Args:
        job_type: only jobs of this type (None: any type).
        filters: JobRecord fields and the values they must have; ``payload`` is
            matched by containment (see the module docstring).

    Raises:
        InvalidArgument: a filter names no JobRecord field, or ``status`` is no JobStatus.

    Example:
        ``[job.payload for job in testing.enqueued_jobs(engine, "email.send", queue="mail")]``
    """
    status, wanted = _split(filters)
    return [job for job in _jobs(engine, job_type, status) if not _mismatches(job, wanted)]


def assert_enqueued(engine: Engine, job_type: str, payload: Any = None, **filters: Any) -> JobRecord:
    """Assert that a job of ``job_type`` matching ``payload`` and ``filters`` is enqueued; return the oldest such job.

    Args:
        payload: what the job's payload must contain (None: any payload).
        filters: as for :func:`enqueued_jobs`.

    Raises:
        AssertionError: no job matches; the message lists what was enqueued instead.
        InvalidArgument: a filter names no JobRecord field.

    Example:
        ``testing.assert_enqueued(engine, "email.send", {"to": "a@b.c"}, queue="mail")``
    """
    # pytest shows a failure at the test's own line, not at this function's source.
    __tracebackhide__ = True
    status, wanted = _split(_with_payload(payload, filters))
    candidates = _jobs(engine, job_type, status)
    matching = [job for job in candidates if not _mismatches(job, wanted)]
    if matching:
        return matching[0]
    lines = [f"Expected a {_described(job_type, status, wanted)}; none is enqueued."]
    if candidates:
        lines.append(f"{_count(len(candidates), status)} of type {job_type!r} instead:")
        lines += [f"  {_shown(job)}  (differs in: {_differences(job, wanted)})" for job in candidates[:SHOWN_JOBS]]
        if len(candidates) > SHOWN_JOBS:
            lines.append(f"  ... and {len(candidates) - SHOWN_JOBS} more")
    else:
        lines.append(f"No {_phrase(status)}job of type {job_type!r} is enqueued.")
    lines.append(_others(engine, job_type, status))
    raise AssertionError("\n".join(lines))


def refute_enqueued(engine: Engine, job_type: str, payload: Any = None, **filters: Any) -> None:
    """Assert that no job of ``job_type`` matching ``payload`` and ``filters`` is enqueued.

    Raises:
        AssertionError: some job matches; the message lists the ones that do.
        InvalidArgument: a filter names no JobRecord field.

    Example:
        ``testing.refute_enqueued(engine, "email.send", {"to": "blocked@b.c"})``
    """
    __tracebackhide__ = True  # as in assert_enqueued
    status, wanted = _split(_with_payload(payload, filters))
    matching = [job for job in _jobs(engine, job_type, status) if not _mismatches(job, wanted)]
    if not matching:
        return
    lines = [f"Expected no {_described(job_type, status, wanted)}; found {len(matching)}:"]
    lines += [f"  {_shown(job)}" for job in matching[:SHOWN_JOBS]]
    if len(matching) > SHOWN_JOBS:
        lines.append(f"  ... and {len(matching) - SHOWN_JOBS} more")
    raise AssertionError("\n".join(lines))


def _with_payload(payload: Any, filters: dict[str, Any]) -> dict[str, Any]:
    return filters if payload is None else {"payload": payload, **filters}


def _split(filters: dict[str, Any]) -> tuple[Optional[JobStatus], dict[str, Any]]:
    """The status asked for (None: any) and the other filters, checked."""
    unknown = sorted(set(filters) - FILTERS)
    if unknown:
        raise InvalidArgument(", ".join(unknown), filters[unknown[0]], f"a JobRecord field, one of {', '.join(sorted(FILTERS))}")
    wanted = dict(filters)
    status = wanted.pop("status", JobStatus.PENDING)
    if status is not None:
        try:
            status = JobStatus(status)
        except ValueError:
            raise InvalidArgument("status", status, f"a JobStatus, one of {', '.join(s.value for s in JobStatus)}") from None
    return status, wanted


def _jobs(engine: Engine, job_type: Optional[str], status: Optional[JobStatus]) -> list[JobRecord]:
    """Every job of the type and status, oldest first (the store lists newest first, a page at a time)."""
    found: list[JobRecord] = []
    while True:
        page = list_jobs(engine, status=status, job_type=job_type, limit=_PAGE, before=found[-1] if found else None)
        found += page
        if len(page) < _PAGE:
            return found[::-1]


def _mismatches(job: JobRecord, wanted: dict[str, Any]) -> list[str]:
    """The filters ``job`` does not meet, by name."""
    differ = []
    for name, value in wanted.items():
        actual = getattr(job, name, _ANY)
        if not (_contains(actual, value) if name == "payload" else actual == value):
            differ.append(name)
    return differ


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and _contains(actual[k], v) for k, v in expected.items())
    return _same_json(actual, expected)


def _same_json(actual: Any, expected: Any) -> bool:
    """Equal as JSON values: ``true`` is not ``1``, as Python's ``True == 1`` would have it."""
    if isinstance(expected, (list, tuple)):
        return (isinstance(actual, list) and len(actual) == len(expected)
                and all(_same_json(a, e) for a, e in zip(actual, expected, strict=True)))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and actual.keys() == expected.keys() and all(
            _same_json(actual[k], v) for k, v in expected.items())
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual is expected
    return bool(actual == expected)


def _described(job_type: str, status: Optional[JobStatus], wanted: dict[str, Any]) -> str:
    """``pending job of type 'x' with payload containing {...} and queue='y'``."""
    parts = [f"payload containing {_cut(wanted['payload'])}"] if "payload" in wanted else []
    parts += [f"{name}={value!r}" for name, value in wanted.items() if name != "payload"]
    return f"{_phrase(status)}job of type {job_type!r}" + (f" with {' and '.join(parts)}" if parts else "")


def _differences(job: JobRecord, wanted: dict[str, Any]) -> str:
    """The filters ``job`` misses, each with the job's own value (its payload is shown beside)."""
    return ", ".join(name if name == "payload" else f"{name}={getattr(job, name)!r}" for name in _mismatches(job, wanted))


def _phrase(status: Optional[JobStatus]) -> str:
    return "" if status is None else f"{status.value.lower()} "


def _count(number: int, status: Optional[JobStatus]) -> str:
    return f"{number} {_phrase(status)}job{'s' if number != 1 else ''}"


def _shown(job: JobRecord) -> str:
    queue = f" queue={job.queue!r}" if job.queue != "default" else ""
    return f"{job.id} {job.status.value} payload={_cut(job.payload)}{queue}"


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_PAYLOAD_CHARS else text[: SHOWN_PAYLOAD_CHARS - 3] + "..."


def _others(engine: Engine, job_type: str, status: Optional[JobStatus]) -> str:
    """How many jobs of each other type are enqueued, with their ids."""
    by_type: dict[str, list[str]] = {}
    for job in _jobs(engine, None, status):
        if job.job_type != job_type:
            by_type.setdefault(job.job_type, []).append(str(job.id))
    if not by_type:
        return f"No other {_phrase(status)}jobs are enqueued."
    shown = [f"{name} x{len(ids)} ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''})" for name, ids in sorted(by_type.items())]
    return f"Other {_phrase(status)}jobs: " + "; ".join(shown)
