"""A tiny application for the CLI worker test: ``--app tests.cli_app:registry``."""

import runledger_sync as rl

registry = rl.JobRegistry()


@registry.job("cli.echo")
def echo(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    return rl.JobCompletion.success().with_output({"echo": payload["say"]})
