"""Which uncaught handler exceptions are retried, and why a job was or was not retried.

An exception a handler does not turn into a :class:`~runledger_sync.core.types.JobFailure`
itself is a retryable failure that spends an attempt (``job.handler_exception``),
so ``max_attempts`` means what it says. A job type's :class:`ExceptionRules` stop
some at once: one in ``dead_letter_on``, or, when ``retry_on`` was narrowed from
its default ``(Exception,)``, one outside it. Those are the seed's panic
(PANICKED, ``job.handler_panic``): dead-lettered without a retry.

Both settings may be given to the registry (every type) and to one type; the
type's own setting wins, each setting on its own.

:func:`not_retried_because` says in plain words why a job was dead-lettered;
the dead-letter hook's info, the command line and the dashboard all use it
(see :mod:`runledger_sync.core.retry_summary`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional

from runledger_sync.core.registry_errors import InvalidExceptionRules
from runledger_sync.core.types import JobDeadLetterReason, JobFailureKind

ExceptionClasses = tuple[type[BaseException], ...]

#: The key of the failure events that records which setting stopped a handler's exception.
STOPPED_BY_EVENT_KEY = "stopped_by"


class Verdict(str, enum.Enum):
    """What a job type's rules make of an uncaught exception."""

    #: Retried, spending an attempt (``job.handler_exception``).
    RETRY = "retry"
    #: Listed in ``dead_letter_on``: dead-lettered at once.
    DEAD_LETTER_ON = "dead_letter_on"
    #: Outside a narrowed ``retry_on``: dead-lettered at once.
    NOT_IN_RETRY_ON = "retry_on"


def checked_exception_classes(what: str, given: Any) -> ExceptionClasses:
    """``given`` as a tuple of Exception subclasses (one class is accepted, as ``except`` accepts one).

    Raises:
        InvalidExceptionRules: ``registry.invalid_exception_rules``, naming ``what`` and the value.
    """
    entries = (given,) if isinstance(given, type) else given
    if not isinstance(entries, (tuple, list)):
        raise InvalidExceptionRules(f"{what} must be a tuple of exception classes, got {given!r}")
    for entry in entries:
        # Only Exception subclasses: retrying on JobCancelled or KeyboardInterrupt
        # would turn a request to stop into another attempt.
        if not (isinstance(entry, type) and issubclass(entry, Exception)):
            raise InvalidExceptionRules(f"{what} must hold Exception subclasses, got {entry!r}")
    return tuple(entries)


@dataclass(frozen=True)
class ExceptionRules:
    """The retry rules of a job type's uncaught exceptions; build one with :meth:`checked`."""

    retry_on: ExceptionClasses = (Exception,)
    dead_letter_on: ExceptionClasses = ()

    @classmethod
    def checked(cls, owner: str, *, retry_on: Any = None, dead_letter_on: Any = None,
                defaults: Optional["ExceptionRules"] = None) -> "ExceptionRules":
        """Rules from user arguments; a setting left as None keeps the one of ``defaults`` (the registry's).

        Raises:
            InvalidExceptionRules: a setting is not a tuple of Exception subclasses.
        """
        base = defaults or cls()
        return cls(
            base.retry_on if retry_on is None else checked_exception_classes(f"retry_on {owner}", retry_on),
            base.dead_letter_on if dead_letter_on is None
            else checked_exception_classes(f"dead_letter_on {owner}", dead_letter_on),
        )

    def classify(self, exc: BaseException) -> Verdict:
        """What ``exc`` makes of the attempt: ``dead_letter_on`` is checked first, so it wins over ``retry_on``."""
        if isinstance(exc, self.dead_letter_on):
            return Verdict.DEAD_LETTER_ON
        if not isinstance(exc, self.retry_on):
            return Verdict.NOT_IN_RETRY_ON
        return Verdict.RETRY


def not_retried_because(
    reason: JobDeadLetterReason, kind: JobFailureKind, code: Optional[str], *, attempts_spent: int,
    max_attempts: Optional[int], stopped_by: Optional[Verdict] = None, error_type: Optional[str] = None,
) -> str:
    """Why a job was dead-lettered, in plain words: ``attempts exhausted (5 of 5)``, ``\\`ValueError\\` is in dead_letter_on``."""
    if reason is JobDeadLetterReason.ATTEMPTS_EXHAUSTED:
        limit = "?" if max_attempts is None else max_attempts
        return f"attempts exhausted ({attempts_spent} of {limit})"
    if stopped_by is Verdict.DEAD_LETTER_ON:
        return f"`{error_type}` is in dead_letter_on"
    if stopped_by is Verdict.NOT_IN_RETRY_ON:
        return f"`{error_type}` is not in retry_on"
    return f"a {kind.value} failure ({code}) is never retried"
