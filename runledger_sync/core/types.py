"""The job lifecycle's vocabulary: failures, outcomes and the handler's context.

A job's status and stage are in :mod:`runledger_sync.core.states`, which the
records use too (so the records and this module do not import each other).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union
from uuid import UUID

from runledger_sync.core.errors import JobCancelled
from runledger_sync.core.flag import Flag

if TYPE_CHECKING:
    from runledger_sync.core.records import JobRecord
    from runledger_sync.core.workflow import WorkflowContext


class JobFailureKind(str, enum.Enum):
    """Why an attempt failed; decides between retry and dead letter."""

    RETRYABLE = "RETRYABLE"
    TIMEOUT = "TIMEOUT"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    TERMINAL = "TERMINAL"
    PANICKED = "PANICKED"

    @property
    def is_retryable(self) -> bool:
        return self not in (JobFailureKind.TERMINAL, JobFailureKind.PANICKED)


class JobEventType(str, enum.Enum):
    """The kinds of rows in the append-only ``job_events`` log."""

    ENQUEUED = "ENQUEUED"
    LEASED = "LEASED"
    HEARTBEAT = "HEARTBEAT"
    STAGE_CHANGED = "STAGE_CHANGED"
    PROGRESS = "PROGRESS"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD_LETTERED = "DEAD_LETTERED"
    CANCELED = "CANCELED"
    REQUEUED = "REQUEUED"


class EventLog(str, enum.Enum):
    """How much of the event log enqueue and the worker's hot path write (``JobsConfig.event_log``).

    Every transition of a job's status after its enqueue, and every operator
    action, is always logged; the levels differ only in the rows that repeat
    what the job row and its attempt row already show.
    """

    #: Every event of the spec: ENQUEUED, LEASED at claim, STAGE_CHANGED to running, each HEARTBEAT.
    FULL = "full"
    #: No ENQUEUED, LEASED, STAGE_CHANGED to running or HEARTBEAT rows; everything else as FULL.
    #: The ENQUEUED entry that :func:`runledger_sync.list_events` lists is drawn from the job row.
    TRANSITIONS = "transitions"


#: The level wherever none is given: the rows it leaves out cost a write each on
#: the hot path and say nothing the job and attempt rows do not.
DEFAULT_EVENT_LOG = EventLog.TRANSITIONS


class ClaimOrigin(str, enum.Enum):
    """How an attempt was claimed; only prestart claims can be released unstarted."""

    DIRECT = "DIRECT"
    WORKER_PRESTART = "WORKER_PRESTART"


class JobDeadLetterReason(str, enum.Enum):
    """Why a job ended in the dead letters."""

    FAILURE_KIND_NON_RETRYABLE = "FAILURE_KIND_NON_RETRYABLE"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    LEASE_EXPIRED = "LEASE_EXPIRED"


class RuntimeLoopExit(str, enum.Enum):
    """How a runtime loop (worker, reaper, scheduler) ended."""

    SHUTDOWN = "SHUTDOWN"
    INVALID_CONFIG = "INVALID_CONFIG"
    #: Defensive: the loop ended without being asked to.
    COMPLETED = "COMPLETED"


class JobFailure(Exception):
    """Raise from a handler to choose the attempt's outcome.

    Example:
        ``raise JobFailure.retryable("smtp.busy", "server said 421")``
    """

    def __init__(
        self, kind: JobFailureKind, code: str, message: str, *, retry_after: Optional[timedelta] = None,
    ) -> None:
        self.kind = JobFailureKind(kind)
        self.code = code
        self.message = message
        #: The handler's hint: retry no sooner than this (a lower bound on the backoff's delay).
        self.retry_after = retry_after
        super().__init__(f"{self.kind.value} {code}: {message}")

    @classmethod
    def retryable(cls, code: str, message: str, *, retry_after: Optional[timedelta] = None) -> "JobFailure":
        """A failure the job retries after, when attempts remain.

        Args:
            retry_after: retry no sooner than this, e.g. a server's ``Retry-After``:
                the delay is the longer of this and the backoff's. Zero up to 365
                days; any other value ends the job with ``job.invalid_retry_timing``.

        Example:
            ``raise JobFailure.retryable("api.busy", "429", retry_after=timedelta(seconds=10))``
        """
        return cls(JobFailureKind.RETRYABLE, code, message, retry_after=retry_after)

    @classmethod
    def terminal(cls, code: str, message: str) -> "JobFailure":
        return cls(JobFailureKind.TERMINAL, code, message)

    @classmethod
    def timeout(cls, code: str, message: str) -> "JobFailure":
        return cls(JobFailureKind.TIMEOUT, code, message)

    @classmethod
    def panicked(cls, code: str, message: str) -> "JobFailure":
        return cls(JobFailureKind.PANICKED, code, message)

    @classmethod
    def lease_expired(cls, code: str, message: str) -> "JobFailure":
        return cls(JobFailureKind.LEASE_EXPIRED, code, message)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobFailure):
            return NotImplemented
        return ((self.kind, self.code, self.message, self.retry_after)
                == (other.kind, other.code, other.message, other.retry_after))

    def __hash__(self) -> int:
        return hash((self.kind, self.code, self.message))


class Snooze(Exception):
    """Raise from a handler to run the job again after ``seconds``, keeping its checkpoint.

    The same as returning ``JobCompletion(continue_after=seconds)`` (spec T14):
    the job waits PENDING, then runs as its next run, attempt 0, without
    spending an attempt. A job snoozes at most its definition's
    ``max_continuations`` times (default 100).

    Args:
        seconds: how long to wait, in seconds or as a timedelta: zero up to 365
            days; any other value ends the job with ``job.invalid_continuation_delay``.

    Example:
        ``raise Snooze(30)``
    """

    def __init__(self, seconds: Union[float, timedelta]) -> None:
        self.seconds = seconds
        super().__init__(f"snooze for {seconds!r}")


@dataclass(frozen=True)
class JobCompletion:
    """What a successful handler reports; every field is optional.

    With ``continue_after`` the run ends without ending the job: it runs again
    after that delay as its next run, attempt 0, seeing ``checkpoint`` (or the
    stored one when None) in ``ctx.checkpoint`` (spec T14). A continuation
    has no output: giving one ends the job with ``job.continuation_output_not_allowed``.

    Example:
        ``return JobCompletion.success().with_output({"sent": 3})``
        ``return JobCompletion(continue_after=timedelta(seconds=30), checkpoint={"page": 2})``
    """

    progress_done: Optional[int] = None
    progress_total: Optional[int] = None
    checkpoint: Any = None
    output: Any = None
    #: Run again after this delay (a timedelta, or seconds) instead of succeeding.
    continue_after: Union[timedelta, float, None] = None

    @classmethod
    def success(cls) -> "JobCompletion":
        return cls()

    def with_output(self, output: Any) -> "JobCompletion":
        return replace(self, output=output)

    def with_progress(self, done: int, total: int) -> "JobCompletion":
        return replace(self, progress_done=done, progress_total=total)

    def with_checkpoint(self, checkpoint: Any) -> "JobCompletion":
        return replace(self, checkpoint=checkpoint)


@dataclass(frozen=True)
class JobDeadLetterInfo:
    """What a dead-letter hook is told: the failure, the reason, and the attempt budget.

    ``max_attempts`` is None when the reaper dead-lettered the job. ``exception``
    is what the handler raised on its last attempt (the live object, with its
    ``__traceback__``); None when it raised nothing: a timeout, an invalid
    result, a lease the reaper found expired.
    """

    failure: JobFailure
    reason: JobDeadLetterReason
    max_attempts: Optional[int]
    exception: Optional[BaseException] = field(default=None, compare=False)
    #: Why the job was not retried, in the words ``jobs show`` and the dashboard use:
    #: ``attempts exhausted (5 of 5)``, ``\`ValueError\` is in dead_letter_on``. None from the reaper.
    not_retried_because: Optional[str] = None


ProgressReporter = Callable[["JobContext", Optional[int], Optional[int], Any], None]
#: Writes the attempt's success on the handler's own bind (see JobContext.complete_in).
Completer = Callable[["JobContext", Any, Optional[JobCompletion]], "JobRecord"]


@dataclass
class JobContext:
    """The identity of one attempt, handed to the handler.

    Long handlers should look at :attr:`cancelled` (or call :meth:`check_cancelled`)
    between steps: the worker sets it on deadline, lease loss and operator cancel.
    """

    job_id: UUID
    run_number: int
    attempt: int
    organization_id: Optional[str]
    worker_id: str
    job_type: str = ""
    checkpoint: Any = None
    #: The workflow step this job runs (``.run_id``, ``.step_key``, ``.output_of(key)``, ``.append(more, ...)``);
    #: None for a plain job.
    workflow: Optional["WorkflowContext"] = None
    #: The metadata the job was enqueued with (text keys to text values; empty when none).
    meta: Mapping[str, str] = field(default_factory=dict)
    #: The batch this job is a member of (``rl.open_batch``); None for a job of none. A member
    #: may add more members to it while it is OPEN: ``rl.enqueue(..., batch=ctx.batch_id)``.
    batch_id: Optional[UUID] = None
    _cancel_flag: Flag = field(default_factory=Flag, repr=False, compare=False)
    _cancel_reason: Optional[str] = field(default=None, repr=False)
    _progress_reporter: Optional[ProgressReporter] = field(default=None, repr=False, compare=False)
    _completer: Optional[Completer] = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once the worker has asked this attempt to stop."""
        return self._cancel_flag.is_set()

    @property
    def cancel_reason(self) -> Optional[str]:
        """Why the attempt was told to stop: ``timeout``, ``lease_lost``, ``shutdown``, or an operator's cancel reason.

        An operator's cancel gives the reason it was made with (``CANCELED`` when none was given).
        """
        return self._cancel_reason

    def check_cancelled(self) -> None:
        """Raise :class:`JobCancelled` if the worker has asked this attempt to stop."""
        if self._cancel_flag.is_set():
            raise JobCancelled(self._cancel_reason or "cancelled")

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancellation; return the flag."""
        return self._cancel_flag.wait(timeout)

    def request_cancel(self, reason: str) -> None:
        """Set the cancellation flag; the first reason given is kept."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._cancel_flag.set()

    def report_progress(self, done: Optional[int], total: Optional[int], checkpoint: Any = None) -> None:
        """Persist progress (and optionally a checkpoint) under this attempt's lease.

        Raises:
            LeaseOwnerMismatch: the lease was lost.
            InvalidProgress: done/total negative or done > total.
            CheckpointTooLarge: the checkpoint is larger than the worker's payload limit
                (``max_payload_bytes``); nothing of the report is written.
        """
        if self._progress_reporter is None:
            raise RuntimeError("report_progress is only available inside a worker")
        self._progress_reporter(self, done, total, checkpoint)
        if checkpoint is not None:
            self.checkpoint = checkpoint

    def complete_in(self, bind: Any, completion: Optional[JobCompletion] = None) -> "JobRecord":
        """Write this attempt's success inside your own open transaction.

        Use it when the handler's database side effects and the job's success
        must commit together: do your writes, call ``ctx.complete_in(conn)`` on
        the same bind, then commit and return. The write is fenced by the lease
        like any other, so a lost lease raises inside your transaction; let it
        propagate and your writes roll back with it. The job row stays locked
        until your transaction ends, so commit soon after.

        After you commit, the worker writes nothing more for the attempt (your
        return value is then ignored). If your transaction did not commit (you
        rolled back, or returned without committing), the worker records the
        handler's outcome as usual: its return value, or the exception it raised.

        Args:
            bind: the SQLAlchemy Connection, ORM Session or psycopg (2 or 3) connection
                that holds your open transaction, on the queue's database (and
                schema: use ``rl.with_schema`` if the worker's engine does).
            completion: progress, checkpoint and output to record (default none).

        Returns:
            The job row as your transaction sees it (SUCCEEDED).

        Raises:
            LeaseOwnerMismatch: the lease was lost or the job was canceled.
            JobCancelled: the attempt is past its deadline.
            InvalidCompletionProgress, InvalidPayload: ``completion`` is invalid.

        Example:
            ``with engine.begin() as conn: conn.execute(insert_invoice); ctx.complete_in(conn)``
        """
        if self._completer is None:
            raise RuntimeError("complete_in is only available inside a worker")
        return self._completer(self, bind, completion)
