"""A tiny application for the CLI worker test: ``--app tests.cli_app:registry``."""

import time

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

#: A handler whose queue is a typo of the declared one: ``--app tests.cli_app:queue_typo``.
queue_typo = rl.JobRegistry()
queue_typo.queue("mail")
queue_typo.job("cli.mail", queue="mial")(echo)

#: Handlers for the shutdown tests: ``--app tests.cli_app:stopping``. One waits
#: for its cancellation as a well-behaved long job does; one never looks at it.
stopping = rl.JobRegistry()


@stopping.job("cli.wait_cancel", max_attempts=1)
def wait_cancel(ctx: rl.JobContext, payload: dict) -> None:
    ctx.wait_cancelled(60)
    ctx.check_cancelled()


@stopping.job("cli.ignore_cancel", max_attempts=3)
def ignore_cancel(ctx: rl.JobContext, payload: dict) -> None:
    time.sleep(60)

#: An app with a second queue: ``--app tests.cli_app:queued``. cli.echo stays in
#: the default queue; cli.mail joins "mail", declared here with a global limit.
queued = rl.JobRegistry()
queued.job("cli.echo")(echo)
queued.queue("mail", global_limit=2)


@queued.job("cli.mail", queue="mail")
def mail(ctx: rl.JobContext, payload: dict) -> None:
    return None
