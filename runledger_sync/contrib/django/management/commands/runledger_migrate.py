"""``manage.py runledger_migrate``: upgrade the queue schema and write the job definitions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from runledger_sync.contrib import django as runledger


class Command(BaseCommand):
    help = "Upgrade the Runledger queue schema to the newest revision and write the registry's job definitions."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default=None,
                            help='the DATABASES alias holding the queue (default: RUNLEDGER["DATABASE"] or "default")')

    def handle(self, *args: Any, **options: Any) -> None:
        before, after = runledger.migrate(options["database"])
        moved = "already up to date" if before == after else f"migrated from {before or 'an empty database'}"
        self.stdout.write(f"schema at {after} ({moved})")
