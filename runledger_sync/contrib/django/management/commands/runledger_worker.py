"""``manage.py runledger_worker``: run the project's job handlers until SIGINT or SIGTERM."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

import runledger_sync as rl
from runledger_sync.contrib import django as runledger
from runledger_sync.logging import LOG_FORMATS


class Command(BaseCommand):
    help = "Run the Runledger worker for RUNLEDGER['REGISTRY'] until SIGINT or SIGTERM."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default=None,
                            help='the DATABASES alias holding the queue (default: RUNLEDGER["DATABASE"] or "default")')
        parser.add_argument("--concurrency", type=int, default=None,
                            help="most jobs run at once (default: the configured max_global_concurrency)")
        parser.add_argument("--drain-timeout", type=float, default=30.0,
                            help="seconds running jobs get to finish after the first signal (default 30)")
        parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                            help="text (one line per finished job) or json; default $RUNLEDGER_LOG_FORMAT, else text "
                                 "on a terminal and json otherwise (Django's LOGGING, when it covers us, wins)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rl.configure_logging_unless_configured(log_format=options["log_format"])
        except rl.ConfigError as refused:
            raise CommandError(str(refused), returncode=2) from None
        config = runledger.get_config()
        if options["concurrency"] is not None:
            config = config.with_overrides(max_global_concurrency=options["concurrency"])
        supervisor = runledger.build_supervisor(config, using=options["database"])
        status = supervisor.run_until_shutdown(drain_timeout=options["drain_timeout"])
        if status:
            raise CommandError("the worker stopped after a failure or a drain timeout", returncode=status)
