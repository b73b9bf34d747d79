"""``manage.py runledger_migrate``: upgrade the queue schema and write the job definitions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from runledger_sync.contrib import django as runledger
from runledger_sync.contrib.django import _app_config


class Command(BaseCommand):
    help = "Upgrade the Runledger queue schema to the newest revision and write the registry's job definitions."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default=None,
                            help='the DATABASES alias holding the queue (default: RUNLEDGER["DATABASE"] or "default")')

    def handle(self, *args: Any, **options: Any) -> None:
        before, after = runledger.migrate(options["database"])
        moved = "already up to date" if before == after else f"migrated from {before or 'an empty database'}"
        written = ""
        if _app_config().runledger_settings.registry is not None:
            # Worded as `runledger-sync migrate --app` words it, so a deploy log reads the same either way.
            registry = runledger.get_registry()
            written = (f"; {len(registry.definitions())} job definition(s) and "
                       f"{len(registry.schedules)} schedule(s) written")
        self.stdout.write(f"schema at {after} ({moved}){written}")
