"""The application of the PgBouncer tests' CLI worker: ``--app tests.pool_app:registry``."""

import runledger_sync as rl

JOB_TYPE = "pool.noop"

registry = rl.JobRegistry()


@registry.job(JOB_TYPE)
def noop(ctx: rl.JobContext, payload: dict) -> None:
    return None
