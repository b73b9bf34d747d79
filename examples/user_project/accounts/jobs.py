"""The application's jobs, and the code that enqueues them.

The handlers close over the engine and the outbox they are given, so a test
hands them its own database and a list to read the sent mail from.
"""

from __future__ import annotations

from typing import Any

import runledger_sync as rl

BOUNCING_DOMAIN = "@bounce.test"


def sign_up(engine: Any, email: str) -> rl.JobRecord:
    """Create the account (not shown) and enqueue its welcome email."""
    return rl.enqueue(engine, "email.welcome", {"to": email}, queue="mail")


def create_registry(engine: Any, outbox: list[dict[str, Any]]) -> rl.JobRegistry:
    """The application's job handlers; ``outbox`` stands in for the mail server."""
    registry = rl.JobRegistry()
    registry.queue("mail")

    @registry.job("email.welcome", max_attempts=3, queue="mail")
    def send_welcome(ctx: rl.JobContext, payload: dict[str, Any]) -> None:
        if payload["to"].endswith(BOUNCING_DOMAIN):
            raise rl.JobFailure.retryable("smtp.bounce", "the mailbox is unavailable")
        outbox.append({"to": payload["to"], "subject": "Welcome!"})
        rl.enqueue(engine, "crm.sync", {"email": payload["to"]})

    @registry.job("crm.sync")
    def sync_crm(ctx: rl.JobContext, payload: dict[str, Any]) -> rl.JobCompletion:
        return rl.JobCompletion(output={"synced": payload["email"]})

    return registry
