"""Audited replays (spec ``job_replays``): the record of one, and the rules a request to replay must keep.

A replay is an operator's requeue of a finished job that leaves a row behind
(who, why, what they expected the job to be, which run it started). Its key
names it: the same key with the same request is the same replay, so a retried
request (a double click, a script run twice) requeues the job once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional
from uuid import UUID

from runledger_sync.core import validation as check
from runledger_sync.core.replay_errors import ReplayKeyBlank, ReplayKeyTooLong, ReplayReasonBlank

#: Held in a unique index beside the job id: 255 characters are at most 1020 bytes, well
#: inside the 2704 bytes a btree row may take.
REPLAY_KEY_MAX_LENGTH = 255
REPLAY_REASON_MAX_LENGTH = 255
ACTOR_MAX_LENGTH = 255


@dataclass(frozen=True)
class ReplayRequest:
    """What a replay asks for; a repeat of its key must ask for the same."""

    reason: str
    actor: Optional[str]
    expected_status: Optional[str]
    expected_run_number: Optional[int]


@dataclass(frozen=True)
class JobReplay:
    """One row of ``job_replays``: an audited requeue of a finished job.

    Attributes:
        id: The replay's id.
        job_id: The job run again.
        replay_key: The key naming the replay, unique per job.
        actor: Who replayed it (the dashboard's user from its authorize hook), or None.
        reason: Why, as the operator said (also the job's status reason and its REQUEUED event's).
        expected_status: The status the operator expected the job to be in, if any.
        expected_run_number: The run the operator expected the job to be in, if any.
        run_number: The run the replay started.
        created_at: When it was replayed.
        disposition: ``"created"`` when this call requeued the job, ``"existing"`` when the
            key had already replayed it (nothing more was requeued); None as listed.
    """

    id: UUID
    job_id: UUID
    replay_key: str
    actor: Optional[str]
    reason: str
    expected_status: Optional[str]
    expected_run_number: Optional[int]
    run_number: int
    created_at: datetime
    disposition: Optional[str] = field(default=None, compare=False)

    @property
    def request(self) -> ReplayRequest:
        return ReplayRequest(self.reason, self.actor, self.expected_status, self.expected_run_number)


def check_replay_key(value: Any) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise ReplayKeyBlank("replay_key", value, "non-blank")
        if len(value) > REPLAY_KEY_MAX_LENGTH:
            raise ReplayKeyTooLong("replay_key", f"{value[:40]}... ({len(value)} characters)",
                                   f"at most {REPLAY_KEY_MAX_LENGTH} characters")
    return check.check_text("replay_key", value, max_length=REPLAY_KEY_MAX_LENGTH)


def check_replay_reason(value: Any) -> str:
    if isinstance(value, str) and not value.strip():
        raise ReplayReasonBlank("reason", value, "non-blank")
    return check.check_text("reason", value, max_length=REPLAY_REASON_MAX_LENGTH)


def check_actor(value: Any) -> Optional[str]:
    return None if value is None else check.check_text("actor", value, max_length=ACTOR_MAX_LENGTH)
