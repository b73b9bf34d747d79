"""The example's job handlers; `flask runledger worker` runs them inside the app context."""

import sqlalchemy as sa
from flask import current_app

import runledger_sync as rl

registry = rl.JobRegistry()


@registry.job("email.welcome", max_attempts=5, timeout_seconds=30)
def send_welcome(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    # Send the e-mail here (SMTP, a provider's API). Delivery is at least once, so this
    # example records it only if it is not recorded yet.
    engine = current_app.extensions["runledger"].engine  # the app's engine: we are in its app context
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE users SET welcomed_at = now() WHERE email = :email AND welcomed_at IS NULL"),
                     {"email": payload["email"]})
    return rl.JobCompletion.success().with_output({"welcomed": payload["email"]})
