"""What a registry declares in code besides its handlers: queues and their limits, cron schedules.

:meth:`runledger_sync.JobRegistry.sync_definitions` writes them with the job
definitions; declaring only checks each one and keeps it by name.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping, Optional

from runledger_sync.core.errors import RegistrationError
from runledger_sync.core.flow import DEFAULT_KEY_LIMIT, DEFAULT_QUEUE, QueueSpec, RateLimit
from runledger_sync.core.records import ScheduleSpec
from runledger_sync.core.registry_errors import UndeclaredQueue


class Declarations:
    """The queues and schedules a registry declares, by name (the base of :class:`runledger_sync.JobRegistry`)."""

    def __init__(self) -> None:
        super().__init__()
        self._schedules: dict[str, ScheduleSpec] = {}
        self._queues: dict[str, QueueSpec] = {}

    def schedule(
        self,
        name: str,
        *,
        cron: str,
        job_type: str,
        payload: Any = None,
        max_jitter_seconds: int = 0,
        organization_id: Optional[str] = None,
        timezone: str = "UTC",
    ) -> ScheduleSpec:
        """Declare a cron schedule in code; :meth:`sync_definitions` writes it.

        Args:
            name: Unique name, how operators pause, resume and trigger it.
            cron: 5 fields (crontab), 6-7 seconds first (Runledger), or an @-nickname.
            job_type: The type of the job each fire enqueues.
            payload: Each job's payload; a ``_schedule`` key is added.
            timezone: The IANA zone the cron's wall-clock times are in.

        Raises:
            InvalidCron, InvalidTimezone, InvalidArgument: a value is invalid.
            RegistrationError: the name is taken.

        Example:
            ``registry.schedule("nightly-report", cron="0 0 3 * * *", job_type="reports.export")``
        """
        spec = ScheduleSpec(name, cron, job_type, payload, organization_id, max_jitter_seconds, timezone).checked()
        if name in self._schedules:
            raise RegistrationError(f"a schedule named {name!r} is already declared")
        self._schedules[name] = spec
        return spec

    def queue(
        self, name: str, *, global_limit: Optional[int] = None, key_limit: Optional[int] = DEFAULT_KEY_LIMIT,
        rate_limit: Optional[RateLimit] = None,
    ) -> QueueSpec:
        """Declare a queue's limits in code; :meth:`sync_definitions` writes them (an operator's pause is kept).

        Args:
            name: The queue (job types join it with ``@registry.job(..., queue=name)``).
            global_limit: At most this many of its jobs running at once, across every worker.
            key_limit: At most this many running (or next in line) per concurrency key; None: no limit.
            rate_limit: At most ``count`` claims per ``per_seconds``, across every worker.

        Raises:
            InvalidQueueName, InvalidQueueSetting: a bad name or setting.
            RegistrationError: the queue is already declared.

        Example:
            ``registry.queue("payments", global_limit=4, rate_limit=rl.RateLimit(100, per_seconds=60))``
        """
        spec = QueueSpec(name, global_limit, key_limit, rate_limit).checked()
        if name in self._queues:
            raise RegistrationError(f"a queue named {name!r} is already declared")
        self._queues[name] = spec
        return spec

    def check_queues_named(self, queue_of_type: Mapping[str, str], existing: Iterable[str]) -> None:
        """Refuse a job type whose queue is neither the default, declared here, nor in ``existing`` (the database's).

        Checked when the definitions are synced, not when a handler is registered:
        the module declaring a queue may be imported after the one naming it.

        Raises:
            UndeclaredQueue: the first such type, by name; the message guesses a near name.
        """
        known = sorted({DEFAULT_QUEUE, *self._queues, *existing})
        for job_type, queue in sorted(queue_of_type.items()):
            if queue in known:
                continue
            guesses = difflib.get_close_matches(queue, known, n=1)
            guess = f"did you mean {guesses[0]!r}? " if guesses else ""
            raise UndeclaredQueue(
                f"job type {job_type!r} names queue {queue!r}, which is neither declared nor created; {guess}"
                f"declare it with registry.queue({queue!r}) (with its limits), or create it with "
                "rl.configure_queue before syncing",
                job_type=job_type, queue=queue,
            )

    @property
    def queues(self) -> list[QueueSpec]:
        """The queues declared with :meth:`queue`, by name."""
        return [self._queues[name] for name in sorted(self._queues)]

    @property
    def schedules(self) -> list[ScheduleSpec]:
        """The schedules declared with :meth:`schedule`, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]
