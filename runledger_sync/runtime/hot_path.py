"""The writer of every job's outcome, with the batching policy it lingers by.

A job's running write goes out with its claim (the polling thread's round
trip); its outcome goes to the completer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy.engine import Engine

from runledger_sync.core.validation import DEFAULT_MAX_OUTPUT_BYTES
from runledger_sync.runtime.completer import Completer
from runledger_sync.runtime.observer import WorkerObserver
from runledger_sync.runtime.pace import FinishingSoon


@dataclass(frozen=True)
class HotPathWriters:
    """The completer of a worker's jobs, and how many of them finish soon."""

    completer: Completer
    #: How many running jobs succeed soon: the completer lingers only for those.
    finishing: FinishingSoon

    @classmethod
    def start(
        cls, engine: Engine, worker_id: str, *, finishing: FinishingSoon,
        observer: Optional[WorkerObserver] = None, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> "HotPathWriters":
        """Start the completer.

        It lingers briefly for the company of the jobs ``finishing`` says should
        succeed meanwhile. ``observer`` is told the size and duration of each group
        write. ``max_output_bytes`` is the worker's output limit, which the pool
        threads have already applied.
        """
        completer = Completer(engine, f"runledger-completer-{worker_id}", max_output_bytes=max_output_bytes,
                              still_coming=finishing.others_within, observer=observer)
        finishing.count_succeeding(lambda: completer.waiting)
        return cls(completer=completer, finishing=finishing)

    def close(self) -> None:
        self.completer.close()
