"""The coordination family of errors: a unique job's or a debounce's options refused at enqueue."""

from __future__ import annotations

from runledger_sync.core.errors import InvalidArgument


class InvalidCoordination(InvalidArgument):
    """The enqueue's ``unique`` or ``debounce`` cannot be combined with another of its options."""

    code = "job.invalid_coordination"


class InvalidUnique(InvalidCoordination):
    """A unique job's options are refused: a blank key, a period not a positive whole number of seconds, or states not job statuses."""

    code = "job.invalid_unique"


class InvalidDebounce(InvalidCoordination):
    """A debounce's options are refused: a blank key, a delay that is not positive, or a max_delay shorter than the delay."""

    code = "job.invalid_debounce"
