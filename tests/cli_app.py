"""A tiny application for the CLI worker test: ``--app tests.cli_app:registry``."""

import runledger_sync as rl

registry = rl.JobRegistry()


@registry.job("cli.echo")
def echo(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    return rl.JobCompletion.success().with_output({"echo": payload["say"]})


#: The same app with a schedule declared: ``--app tests.cli_app:scheduled``.
scheduled = rl.JobRegistry()
scheduled.job("cli.echo")(echo)
scheduled.schedule("cli.every-second", cron="*/1 * * * * *", job_type="cli.echo", payload={"say": "tick"})

#: A schedule of a job type nothing registers: ``--app tests.cli_app:unknown_type``.
unknown_type = rl.JobRegistry()
unknown_type.job("cli.echo")(echo)
unknown_type.schedule("cli.orphan", cron="@hourly", job_type="cli.no_such_type")
