"""How long finished jobs and workflow runs are kept (spec section 15), and what a prune removed.

:class:`Retention` holds one age per kind of finished row; ``None`` keeps that
kind forever. :class:`PruneResult` counts what :func:`runledger_sync.prune`
deleted, or with ``dry_run`` would delete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Mapping, Optional

from runledger_sync.core.errors import InvalidArgument

DEFAULT_SUCCEEDED_AGE = timedelta(days=7)
DEFAULT_CANCELED_AGE = timedelta(days=7)
#: Longer: a dead letter is what an operator comes back to diagnose.
DEFAULT_DEAD_LETTERED_AGE = timedelta(days=30)
DEFAULT_WORKFLOW_RUNS_AGE = timedelta(days=30)
#: A finished batch's row (its counts), once no member of it is live; its members go with it.
DEFAULT_JOB_BATCHES_AGE = timedelta(days=30)
#: The dashboard's charts reach back a week at most.
DEFAULT_DASHBOARD_ROLLUP_AGE = timedelta(days=7)

#: Words that mean "keep forever" where an age is written as text.
KEEP_WORDS = ("keep", "none", "off", "never")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
DURATION_EXPECTATION = "a positive duration such as 90s, 30m, 12h, 7d or 2w"


def parse_duration(argument: str, text: str) -> timedelta:
    """``"7d"`` -> ``timedelta(days=7)``; units s, m, h, d, w.

    Raises:
        InvalidArgument: the text is not a positive duration.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise InvalidArgument(argument, text, DURATION_EXPECTATION)
    return timedelta(**{_UNITS[match.group(2).lower()]: float(match.group(1))})


def _check_age(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise InvalidArgument(f"Retention.{name}", value, "a positive timedelta, or None to keep forever")


@dataclass(frozen=True)
class Retention:
    """How long each kind of finished row is kept; None keeps it forever.

    Ages count from the row's ``finished_at`` (a dashboard rollup row's: the
    minute it covers). PENDING and LEASED jobs, and the jobs of a workflow run
    that has not finished, are never pruned, whatever their age.

    Example:
        ``rl.Retention(succeeded=timedelta(days=1), dead_lettered=None)``

    Raises:
        InvalidArgument: an age is not a positive timedelta or None.
    """

    succeeded: Optional[timedelta] = DEFAULT_SUCCEEDED_AGE
    canceled: Optional[timedelta] = DEFAULT_CANCELED_AGE
    dead_lettered: Optional[timedelta] = DEFAULT_DEAD_LETTERED_AGE
    workflow_runs: Optional[timedelta] = DEFAULT_WORKFLOW_RUNS_AGE
    #: The per-minute rows behind the dashboard's charts (table job_rollup_minutes).
    dashboard_rollup: Optional[timedelta] = DEFAULT_DASHBOARD_ROLLUP_AGE
    #: Finished batches (table job_batches), with their members, once none of them is PENDING or LEASED.
    job_batches: Optional[timedelta] = DEFAULT_JOB_BATCHES_AGE

    def __post_init__(self) -> None:
        for item in fields(self):
            _check_age(item.name, getattr(self, item.name))

    @classmethod
    def parse(cls, text: str, *, argument: str = "retention") -> Optional["Retention"]:
        """Read a retention written as text (an environment variable, a command line).

        ``off`` (or ``none``, ``keep``, ``never``) disables pruning (None);
        ``succeeded=1d,dead_lettered=keep`` sets those ages and leaves the others
        at their defaults.

        Raises:
            InvalidArgument: an unknown kind or a bad age.
        """
        stripped = text.strip() if isinstance(text, str) else ""
        if stripped.lower() in KEEP_WORDS:
            return None
        names = [item.name for item in fields(cls)]
        ages: dict[str, Optional[timedelta]] = {}
        for part in (p.strip() for p in stripped.split(",") if p.strip()):
            name, equals, age = (piece.strip() for piece in part.partition("="))
            if not equals or name not in names:
                raise InvalidArgument(argument, text, f"off, or kind=age pairs with kinds {', '.join(names)} "
                                                      "(such as succeeded=7d,dead_lettered=keep)")
            ages[name] = None if age.lower() in KEEP_WORDS else parse_duration(f"{argument} {name}", age)
        if not ages:
            raise InvalidArgument(argument, text, "off, or kind=age pairs such as succeeded=7d,dead_lettered=keep")
        return cls(**ages)

    def describe(self) -> str:
        """The ages as ``parse`` reads them back, for logs and messages."""
        return ",".join(f"{item.name}={_words(getattr(self, item.name))}" for item in fields(self))


def _words(age: Optional[timedelta]) -> str:
    if age is None:
        return "keep"
    seconds = age.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class PruneResult:
    """What one prune deleted, or with ``dry_run`` would delete.

    Attributes:
        jobs: jobs deleted per status (``SUCCEEDED``, ``CANCELED``, ``DEAD_LETTERED``),
            those of pruned workflow runs included.
        attempts, events, dead_letters: rows of those jobs deleted with them.
        workflow_runs, workflow_steps: finished runs deleted, and their steps.
        rollup_minutes: rows of the dashboard's rollup deleted (one per queue per minute).
        job_batches: finished batches deleted (their members are counted in ``jobs``).
        batches: transactions that deleted (or, dry, counted) something.
        elapsed_seconds: wall time of the whole prune.
        dry_run: nothing was deleted; the counts are what would have been.
        contended: an exclusive prune stopped because another one held the lock.
        complete: nothing old was left when it stopped (False after ``max_batches``
            or a contended lock: the next prune goes on).
    """

    jobs: Mapping[str, int] = field(default_factory=dict)
    attempts: int = 0
    events: int = 0
    dead_letters: int = 0
    workflow_runs: int = 0
    workflow_steps: int = 0
    rollup_minutes: int = 0
    batches: int = 0
    job_batches: int = 0
    elapsed_seconds: float = 0.0
    dry_run: bool = False
    contended: bool = False
    complete: bool = True

    @property
    def total_jobs(self) -> int:
        """Jobs deleted, every status together."""
        return sum(self.jobs.values())


__all__ = ["PruneResult", "Retention", "parse_duration"]
