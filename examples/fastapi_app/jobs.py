"""The example's job handlers, run by the (synchronous) worker: `runledger-sync worker --app fastapi_app.jobs:registry`."""

import os
from functools import cache

import sqlalchemy as sa

import runledger_sync as rl

registry = rl.JobRegistry()


@cache
def engine() -> sa.Engine:
    # The worker's own (sync) engine, made on first use: importing the registry connects nowhere.
    return rl.create_engine(os.environ["RUNLEDGER_DATABASE_URL"])


@registry.job("email.welcome", max_attempts=5, timeout_seconds=30)
def send_welcome(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    # Send the e-mail here (SMTP, a provider's API). Delivery is at least once, so this
    # example records it only if it is not recorded yet.
    with engine().begin() as conn:
        conn.execute(sa.text("UPDATE users SET welcomed_at = now() WHERE email = :email AND welcomed_at IS NULL"),
                     {"email": payload["email"]})
    return rl.JobCompletion.success().with_output({"welcomed": payload["email"]})
